#!/usr/bin/env python
"""A command engine that first starts a helper in a session of its own (start_new_session, as
setsid does: outside the engine's process group), writes the helper's pid to HELPER_PIDFILE,
then becomes fake_engine.py with the remaining arguments.

    python session_helper.py HELPER_PIDFILE [fake_engine.py arguments...]
"""

import os
import subprocess
import sys
from pathlib import Path

helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True,
                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
Path(sys.argv[1]).write_text(f"{helper.pid}\n")
fake = str(Path(__file__).with_name("fake_engine.py"))
os.execv(sys.executable, [sys.executable, fake, *sys.argv[2:]])
