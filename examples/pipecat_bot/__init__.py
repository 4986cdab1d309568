"""A Pipecat bot that answers voicegate's calls (issue 32), with offline services only."""
