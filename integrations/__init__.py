"""Integrations of voicegate with other voice-agent frameworks."""
