#!/usr/bin/env python3
"""Data-parallel serving (docs/distributed.md): `tern serve --replicas 2` starts two replicas
behind one front end. Checks that requests spread over both and come back right (plain and
streamed), that a repeated prompt stays on the replica that has its prefix cached, and that a
replica killed under load costs only its own in-flight requests (each ends with an error the
client can read), while the others finish and every later request goes to the survivor.
Python's standard library only; every wait is bounded."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import TERN, TIMEOUT, ServerProcess, real_model  # noqa: E402


class Router(ServerProcess):
    def __init__(self, model, extra=()):
        super().__init__([TERN, "serve", "-m", model, "--replicas", "2", "-t", "1", "--port", "0", "--kv-type", "f32",
                          *extra], TIMEOUT, suffix=" (router)")

    def request(self, method, path, body=None, timeout=TIMEOUT):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    def status(self):
        code, text = self.request("GET", "/router/status")
        assert code == 200, text
        return json.loads(text)["replicas"]

    def close(self):
        self.stop()


def completion(router, prompt, max_tokens=16, stream=False, timeout=TIMEOUT):
    return router.request("POST", "/v1/completions", {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                                                      "stream": stream}, timeout=timeout)


class ReplicaRouterTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.router = Router(real_model())

    @classmethod
    def tearDownClass(cls):
        cls.router.close()
        # Stopping the router stops its replicas: no process of it is left.
        for r in cls.replicas_seen:
            try:
                with open(f"/proc/{r}/stat") as f:
                    alive = f.read().split()[2] != "Z"
            except OSError:
                alive = False
            assert not alive, f"replica {r} outlived the router"

    replicas_seen = []

    def test_a_requests_spread_and_come_back_right(self):
        reps = self.router.status()
        self.assertEqual(len(reps), 2)
        self.assertTrue(all(r["up"] for r in reps), reps)
        ReplicaRouterTest.replicas_seen = [r["pid"] for r in reps]
        want = {}
        for p in ("Once upon a time", "The little dog", "Lily wanted to", "Tom had a ball"):
            code, text = completion(self.router, p)
            self.assertEqual(code, 200, text)
            want[p] = json.loads(text)["choices"][0]["text"]
        before = sum(r["served"] for r in self.router.status())
        results = {}

        def run(i, p):
            results[i] = completion(self.router, p)

        prompts = [p + " " * (i % 3) + str(i) for i, p in enumerate(list(want) * 4)]
        threads = [threading.Thread(target=run, args=(i, p)) for i, p in enumerate(prompts)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
        self.assertEqual(len(results), len(prompts))
        for i, (code, text) in results.items():
            self.assertEqual(code, 200, text)
            self.assertTrue(json.loads(text)["choices"][0]["text"])
        reps = self.router.status()
        self.assertEqual(sum(r["served"] for r in reps) - before, len(prompts))
        self.assertTrue(all(r["served"] > 0 for r in reps), reps)  # both replicas worked
        # The same prompt gives the same greedy text whichever replica answers it.
        for p, text in want.items():
            code, again = completion(self.router, p)
            self.assertEqual(json.loads(again)["choices"][0]["text"], text)

    def test_b_a_repeated_prompt_stays_on_its_replica(self):
        prompt = "Once upon a time there was a cat who liked to sleep in the sun. One day"
        before = [r["affinity_hits"] for r in self.router.status()]
        for _ in range(4):
            code, text = completion(self.router, prompt)
            self.assertEqual(code, 200, text)
        after = [r["affinity_hits"] for r in self.router.status()]
        self.assertGreaterEqual(sum(after) - sum(before), 3)

    def test_c_streams_pass_through(self):
        code, text = completion(self.router, "Once upon a time", max_tokens=8, stream=True)
        self.assertEqual(code, 200, text)
        events = [l[6:] for l in text.split("\n") if l.startswith("data: ")]
        self.assertEqual(events[-1], "[DONE]")
        pieces = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])
        self.assertTrue(pieces)
        code, metrics = self.router.request("GET", "/metrics")
        self.assertEqual(code, 200)
        self.assertIn("tern_router_requests_total", metrics)


class ReplicaDeathTest(unittest.TestCase):
    """A replica killed with requests in flight (a model slow enough for that: the TinyLlama-1.1B
    shape, two layers, q4_K, ~0.5 s per request)."""

    def test_a_killed_replica_costs_only_its_own_requests(self):
        d = tempfile.mkdtemp(prefix="tern_router_model_")
        model = os.path.join(d, "tl2.gguf")
        subprocess.run([TERN, "synth", "--shape", "tinyllama-1.1b", "--layers", "2", "--type", "q4_k", "-o", model],
                       check=True, capture_output=True, timeout=TIMEOUT)
        router = Router(model, extra=("-c", "512"))
        try:
            reps = router.status()
            results = {}

            def run(i):
                results[i] = completion(router, f"Request {i} says", max_tokens=96, stream=(i % 2 == 0))

            threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
            for t in threads:
                t.start()
            # Kill one replica while both have requests in flight.
            end = time.time() + 30
            while time.time() < end and not all(r["in_flight"] > 0 for r in router.status()):
                time.sleep(0.02)
            victim = reps[0]["pid"]
            os.kill(victim, signal.SIGKILL)
            for t in threads:
                t.join(TIMEOUT)
            self.assertEqual(len(results), 8)
            ok = failed = 0
            for i, (code, text) in results.items():
                if code == 200 and "replica_error" not in text:
                    ok += 1
                    continue
                failed += 1
                # A clear error: 502 with JSON before the answer began, or an error event in a stream.
                self.assertIn("replica", text)
                self.assertTrue(code == 502 or (code == 200 and "failed mid-response" in text), (code, text[-300:]))
            self.assertGreater(ok, 0)
            self.assertGreater(failed, 0)
            # The router stops routing to it: every later request succeeds on the survivor.
            for i in range(4):
                code, text = completion(router, f"After {i}", max_tokens=4)
                self.assertEqual(code, 200, text)
            dead = [r for r in router.status() if r["pid"] == victim][0]
            self.assertFalse(dead["up"])
        finally:
            router.close()
            os.remove(model)
            os.rmdir(d)

    def test_bad_replica_url_is_an_error(self):
        r = subprocess.run([TERN, "serve", "-m", real_model(), "--replica", "nowhere", "--port", "0"],
                           capture_output=True, text=True, timeout=TIMEOUT)
        self.assertEqual(r.returncode, 1)
        self.assertIn("expected http://HOST:PORT", r.stderr)


if __name__ == "__main__":
    unittest.main()
