"""Where tern and the test model are, and starting a `tern serve` (or a router, or one under mpirun) for the Python suites: the process
with its output in a log file, and the URL it prints once it listens."""
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TERN = os.environ.get("TERN_BINARY", os.path.join(HERE, "../../build/release/tern"))
SHARED = os.environ.get("TERN_SHARED_DIR", os.path.join(HERE, "../../../shared"))
TIMEOUT = 120


def real_model():
    """stories260K from ../shared, else the repository's own default model."""
    shared = os.path.join(SHARED, "models/stories260K.gguf")
    return shared if os.path.exists(shared) else os.path.join(HERE, "../../models/tern-stories.gguf")


class ServerProcess:
    """Runs `cmd`; url is the first `listening on http://127.0.0.1:PORT` (followed by `suffix`)
    in its output, or RuntimeError with the log's tail after `timeout` seconds or an early exit."""

    def __init__(self, cmd, timeout, suffix="", env=None):
        self.dir = tempfile.mkdtemp(prefix="tern_server_")
        self.log_path = os.path.join(self.dir, "log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=None if env is None else {**os.environ, **env})
        self.url = None
        pattern = re.compile(r"listening on (http://127\.0\.0\.1:\d+)" + re.escape(suffix))
        end = time.time() + timeout
        while time.time() < end and self.proc.poll() is None:
            with open(self.log_path) as f:
                m = pattern.search(f.read())
            if m:
                self.url = m.group(1)
                return
            time.sleep(0.1)
        with open(self.log_path) as f:
            tail = f.read()[-800:]
        self.stop()
        raise RuntimeError("the server did not start: " + tail)

    def stop(self, timeout=60):
        """SIGTERM, then SIGKILL after `timeout` s; the exit status (None when it had to be killed)."""
        rc = self.proc.poll()
        if rc is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                rc = None
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        return rc
