"""Offline speech for the demo agent: pocketsphinx recognition with one grammar per dialog state,
run on a thread of its own (never the media clock or the event loop), and espeak-ng synthesis in
process. Measured facts behind the choices: docs/speech.md."""
