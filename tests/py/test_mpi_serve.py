#!/usr/bin/env python3
"""`tern serve` over the ranks of mpirun (docs/distributed.md): --tp 2 and --pp 2 answer as the
single process does (greedy text; n > 1 completions, whose shared prompt blocks are copied on
write on every rank; streams), a pipeline refuses embeddings with a clear error, and SIGTERM to
mpirun ends every rank. Skipped without mpirun or an MPI build. Every wait is bounded."""
import json
import os
import shutil
import subprocess
import sys
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import TERN, TIMEOUT, ServerProcess, real_model  # noqa: E402


def mpi_available():
    if not shutil.which("mpirun"):
        return False
    r = subprocess.run([TERN, "run", "-m", real_model(), "-p", "hi", "-n", "1", "--tp", "2"], capture_output=True,
                       text=True, timeout=TIMEOUT)
    return "built without MPI" not in r.stderr


class Server(ServerProcess):
    def __init__(self, np, flags):
        cmd = ([TERN] if np == 0 else ["mpirun", "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
               + ["-np", str(np), TERN])
        super().__init__(cmd + ["serve", "-m", real_model(), "-t", "1", "--port", "0", "--kv-type", "f32", "--parallel",
                                "4", *flags], TIMEOUT)

    def post(self, path, body):
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")


def answers(server):
    out = []
    for p in ("Once upon a time", "The little dog", "Lily wanted to"):
        code, text = server.post("/v1/completions", {"prompt": p, "max_tokens": 24, "temperature": 0})
        assert code == 200, text
        out.append(json.loads(text)["choices"][0]["text"])
    code, text = server.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0,
                                                 "n": 3})
    assert code == 200, text
    out.append([c["text"] for c in json.loads(text)["choices"]])
    code, text = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Tell me a story"}],
                                                      "max_tokens": 12, "temperature": 0, "stream": True})
    assert code == 200, text
    events = [l[6:] for l in text.split("\n") if l.startswith("data: ")]
    assert events[-1] == "[DONE]", events[-3:]
    out.append("".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-1]))
    return out


@unittest.skipUnless(mpi_available(), "needs mpirun and a tern built with MPI")
class MpiServeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        s = Server(0, [])
        try:
            cls.want = answers(s)
        finally:
            s.stop()

    def check_layout(self, np, flags):
        s = Server(np, flags)
        try:
            self.assertEqual(answers(s), self.want)
            code, text = s.post("/v1/embeddings", {"input": "hello there"})
            return code, text
        finally:
            rc = s.stop()
            self.assertIsNotNone(rc, "mpirun did not end on SIGTERM")

    def test_tensor_parallel_serves_what_one_process_serves(self):
        code, text = self.check_layout(2, ["--tp", "2"])
        self.assertEqual(code, 200, text)  # tp alone: rank 0 holds the hidden states

    def test_pipeline_serves_what_one_process_serves(self):
        code, text = self.check_layout(2, ["--pp", "2", "--micro-batches", "2"])
        self.assertNotEqual(code, 200)
        self.assertIn("not available from a model split into pipeline stages", text)

    def test_a_pool_with_a_layout_is_refused(self):
        r = subprocess.run([TERN, "serve", "-m", "a=" + real_model(), "-m", "b=" + real_model(), "--tp", "2",
                            "--port", "0"], capture_output=True, text=True, timeout=TIMEOUT)
        self.assertEqual(r.returncode, 1)
        self.assertIn("--tp / --pp serve one model", r.stderr)


if __name__ == "__main__":
    unittest.main()
