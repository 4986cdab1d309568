import sys

from voicegate.cli import main

sys.exit(main())
