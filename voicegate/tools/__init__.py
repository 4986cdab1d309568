"""Side effects: the HTTP tool client, a call's write path (intent, request, receipt), and
reconciliation by status query, live and at start-up.
"""
