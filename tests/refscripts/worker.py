"""The reference scripts of this folder, run one after another in one interpreter: their
libraries (transformers, FlagEmbedding, PyLate) take about five seconds to import, once per test
session instead of once per reference.

Runs in .venv-ref (see tests/helpers/refvenv.py). Reads one JSON line per job from stdin,
{"script", "request", "answer"} (a script's name and its two file arguments), and writes one line
per job to stdout: {"ok": true}, or {"ok": false, "error": the traceback}.
"""

import json
import runpy
import sys
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
replies = sys.stdout
sys.stdout = sys.stderr  # what a script or its libraries print stays out of the replies
for line in sys.stdin:
    job = json.loads(line)
    sys.argv = [str(HERE / f"{job['script']}.py"), job["request"], job["answer"]]
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
        reply = {"ok": True}
    except BaseException:  # a script's sys.exit too: the worker serves the next job
        reply = {"ok": False, "error": traceback.format_exc()}
    replies.write(json.dumps(reply) + "\n")
    replies.flush()
