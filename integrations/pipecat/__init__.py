"""A Pipecat transport and serializer for voicegate's remote-agent protocol (docs/pipecat.md)."""
