"""The signals that say "stop": how a terminal, a scheduler or a service manager ends a run.

Ctrl-C sends SIGINT; ``timeout``, Slurm's ``scancel`` and systemd send SIGTERM, to the
whole process group; a closed terminal or ssh session sends SIGHUP.
"""

from __future__ import annotations

import signal

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
