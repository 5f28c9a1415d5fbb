#!/usr/bin/env python3
"""`tern serve` over the ranks of mpirun (docs/distributed.md): --tp 2 and --pp 2 answer as the
single process does (greedy text; n > 1 completions, whose shared prompt blocks are copied on
write on every rank; streams; LoRA adapters served with --lora and loaded at run time; KV
eviction policies), a
pipeline refuses embeddings with a clear error, and SIGTERM to mpirun ends every rank. Skipped
without mpirun or an MPI build. Every wait is bounded."""
import json
import os
import random
import shutil
import struct
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


def mpi_available():
    if not shutil.which("mpirun"):
        return False
    r = subprocess.run([TERN, "run", "-m", real_model(), "-p", "hi", "-n", "1", "--tp", "2"], capture_output=True,
                       text=True, timeout=TIMEOUT)
    return "built without MPI" not in r.stderr


class Server(ServerProcess):
    def __init__(self, np, flags, env=None):
        """env: variables for every rank (mpirun -x)."""
        self.np = np
        env = env or {}
        cmd = ([TERN] if np == 0 else ["mpirun", "--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
               + [a for k in env for a in ("-x", k)] + ["-np", str(np), TERN])
        super().__init__(cmd + ["serve", "-m", real_model(), "-t", "1", "--port", "0", "--kv-type", "f32", "--parallel",
                                "4", *flags], TIMEOUT, env=env or None)

    def post(self, path, body):
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")


def write_adapter(path, seed, rank=2, std=0.4):
    """A LoRA adapter in llama.cpp's GGUF format (f32) for every 2-D matrix of the model's layers,
    random pairs (pure Python: no numpy needed)."""
    info = json.loads(subprocess.run([TERN, "inspect", real_model(), "--json"], capture_output=True, text=True,
                                     timeout=TIMEOUT, check=True).stdout)
    arch = next(m["value"] for m in info["metadata"] if m["key"] == "general.architecture")
    rng = random.Random(seed)
    tensors = []  # (name, ne, values)
    for t in info["tensors"]:
        ne = t["shape"]
        if not t["name"].startswith("blk.") or len(ne) != 2:
            continue
        n_in, n_out = ne
        tensors.append((t["name"] + ".lora_a", [n_in, rank], [rng.gauss(0, n_in ** -0.5) for _ in range(n_in * rank)]))
        tensors.append((t["name"] + ".lora_b", [rank, n_out], [rng.gauss(0, std) for _ in range(rank * n_out)]))

    def gstr(x):
        b = x.encode()
        return struct.pack("<Q", len(b)) + b
    kvs = [("general.architecture", 8, gstr(arch)), ("general.type", 8, gstr("adapter")),
           ("adapter.type", 8, gstr("lora")), ("adapter.lora.alpha", 6, struct.pack("<f", 0.0))]
    out = bytearray(b"GGUF") + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for k, typ, v in kvs:
        out += gstr(k) + struct.pack("<I", typ) + v
    blobs, off = [], 0
    for name, ne, vals in tensors:
        out += gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        out += struct.pack("<IQ", 0, off)  # F32
        b = struct.pack("<%df" % len(vals), *vals)
        b += b"\0" * ((-len(b)) % 32)
        blobs.append(b)
        off += len(b)
    out += b"\0" * ((-len(out)) % 32)
    with open(path, "wb") as f:
        f.write(bytes(out) + b"".join(blobs))


def adapter_answers(server, base_name):
    """Greedy completions of the base and of each adapter, the second loaded at run time."""
    out = []
    for model in (base_name, "pirate", base_name):
        code, text = server.post("/v1/completions", {"model": model, "prompt": "Once upon a time", "max_tokens": 24,
                                                     "temperature": 0})
        assert code == 200, text
        out.append(json.loads(text)["choices"][0]["text"])
    code, text = server.post("/v1/load_lora_adapter", {"lora_name": "cat", "lora_path": server.cat, "scale": 0.7})
    assert code == 200, text
    code, text = server.post("/v1/completions", {"model": "cat", "prompt": "The little dog", "max_tokens": 24,
                                                 "temperature": 0})
    assert code == 200, text
    out.append(json.loads(text)["choices"][0]["text"])
    code, text = server.post("/v1/unload_lora_adapter", {"lora_name": "cat"})
    assert code == 200, text
    code, text = server.post("/v1/completions", {"model": "cat", "prompt": "x", "max_tokens": 2})
    assert code == 404, text
    # A step after the unload: rank 0 tells the ranks to let go of the adapter, and serving goes on.
    code, text = server.post("/v1/completions", {"model": "pirate", "prompt": "Lily wanted to", "max_tokens": 16,
                                                 "temperature": 0})
    assert code == 200, text
    out.append(json.loads(text)["choices"][0]["text"])
    return out


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

    def test_adapters_serve_what_one_process_serves(self):
        d = tempfile.mkdtemp(prefix="tern_mpi_lora_")
        try:
            pirate, cat = os.path.join(d, "pirate.gguf"), os.path.join(d, "cat.gguf")
            write_adapter(pirate, 1)
            write_adapter(cat, 2)
            base = os.path.splitext(os.path.basename(real_model()))[0]
            flags = ["--lora", "pirate=" + pirate, "--allow-lora-updates"]
            want = None
            for np_, layout in ((0, []), (2, ["--tp", "2"]), (2, ["--pp", "2", "--micro-batches", "2"])):
                s = Server(np_, flags + layout)
                s.cat = cat
                try:
                    got = adapter_answers(s, base)
                finally:
                    self.assertIsNotNone(s.stop(), "mpirun did not end on SIGTERM")
                if want is None:
                    want = got
                    self.assertNotEqual(want[1], want[0], "the adapter changes nothing: the test would not see it missing")
                    self.assertEqual(want[2], want[0])
                else:
                    self.assertEqual(got, want, layout)
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def layouts_agree(self, layouts, flags, collect):
        """collect(server) on a server of each (np, layout) in turn, with `flags`: every result must
        equal the first's, which is returned."""
        want = None
        for np_, layout in layouts:
            s = Server(np_, flags + layout)
            try:
                got = collect(s)
            finally:
                self.assertIsNotNone(s.stop(), "mpirun did not end on SIGTERM")
            if want is None:
                want = got
            else:
                self.assertEqual(got, want, flags + layout)
        return want

    def test_kv_policies_serve_what_one_process_serves(self):
        # Sinks + window (the sinks following the window) and H2O, each request past its budget.
        def collect(s):
            got = []
            for p in ("Once upon a time", "The little dog"):
                code, text = s.post("/v1/completions", {"prompt": p, "max_tokens": 64, "temperature": 0})
                self.assertEqual(code, 200, text)
                got.append(json.loads(text)["choices"][0]["text"])
            return got
        for policy in (["--kv-policy", "streaming", "--sinks", "4", "--window", "24"],
                       ["--kv-policy", "h2o", "--kv-budget", "32", "--window", "8"]):
            self.layouts_agree(((0, []), (2, ["--tp", "2"]), (2, ["--pp", "2"])), policy, collect)

    def test_live_base_swaps_serve_what_one_process_serves(self):
        # A stream on the first base runs while the base is swapped to another model and back:
        # every answer is wholly one base's, as in one process; the ranks load the new base's
        # parts beside the old one and let go of the old one when its last request ends. A LoRA
        # adapter served on the first base is dropped for the other and served again after the
        # swap back (the ranks hold adapters per model).
        other = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../models/tern-stories.gguf")
        key = "admin-sekret"
        d = tempfile.mkdtemp(prefix="tern_mpi_swap_")
        self.addCleanup(shutil.rmtree, d, True)
        # One KV head: --tp 2 cannot split it (refused on rank 0 before any rank loads).
        one_kv_head = os.path.join(d, "gemma3-tiny.gguf")
        subprocess.run([TERN, "synth", "--shape", "gemma3-tiny", "-o", one_kv_head], capture_output=True,
                       timeout=TIMEOUT, check=True)
        pirate = os.path.join(d, "pirate.gguf")
        write_adapter(pirate, 1)
        with_pirate = [{"lora_name": "pirate", "lora_path": pirate}]
        want = None
        for np_, layout in ((0, []), (2, ["--tp", "2"]), (2, ["--pp", "2", "--micro-batches", "2"])):
            s = Server(np_, ["--admin-key", key, "--lora", "pirate=" + pirate] + layout)
            try:
                got = []

                def swap_request(path, lora):
                    return urllib.request.Request(s.url + "/admin/swap_base",
                                                  data=json.dumps({"model": path, "lora": lora}).encode(),
                                                  headers={"Content-Type": "application/json",
                                                           "Authorization": "Bearer " + key})

                def swap(path, lora):
                    with urllib.request.urlopen(swap_request(path, lora), timeout=TIMEOUT) as r:
                        self.assertEqual(r.status, 200)
                        return json.loads(r.read())["path"]

                def complete(prompt, model=None):
                    body = {"prompt": prompt, "max_tokens": 24, "temperature": 0}
                    if model:
                        body["model"] = model
                    code, text = s.post("/v1/completions", body)
                    self.assertEqual(code, 200, text)
                    return json.loads(text)["choices"][0]["text"]

                got.append(complete("Once upon a time"))
                got.append(complete("Once upon a time", "pirate"))
                # A stream that is running (its first event read) when the swap starts.
                req = urllib.request.Request(s.url + "/v1/completions",
                                             data=json.dumps({"prompt": "The little dog", "max_tokens": 300,
                                                              "temperature": 0, "stream": True}).encode(),
                                             headers={"Content-Type": "application/json"})
                stream = urllib.request.urlopen(req, timeout=TIMEOUT)
                first = stream.readline()
                self.assertTrue(first.startswith(b"data: "), first)
                self.assertEqual(swap(other, []), other)  # (the adapter does not fit the other model)
                got.append(complete("The little dog"))
                code, text = s.post("/v1/completions", {"prompt": "x", "max_tokens": 2, "model": "pirate"})
                self.assertEqual(code, 404, text)
                self.assertEqual(swap(real_model(), with_pirate), real_model())
                got.append(complete("The little dog"))
                got.append(complete("Once upon a time", "pirate"))
                # Refused swaps leave the base serving: a missing file; a model the layout cannot split.
                for bad, why in ((os.path.join(d, "missing.gguf"), "missing.gguf"),
                                 (one_kv_head, "does not divide" if layout[:1] == ["--tp"] else None)):
                    req = swap_request(bad, [])
                    if why is None:  # one process, or stages of whole layers: it loads (and is swapped back)
                        with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
                            self.assertEqual(r.status, 200)
                        self.assertEqual(swap(real_model(), with_pirate), real_model())
                        continue
                    with self.assertRaises(urllib.error.HTTPError) as e:
                        urllib.request.urlopen(req, timeout=TIMEOUT)
                    self.assertEqual(e.exception.code, 400)
                    self.assertIn(why, e.exception.read().decode(errors="replace"))
                got.append(complete("Lily wanted to"))
                body = first + stream.read()
                stream.close()
                events = [l[6:] for l in body.decode().split("\n") if l.startswith("data: ")]
                self.assertEqual(events[-1], "[DONE]", events[-3:])
                got.append("".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]))
            finally:
                self.assertIsNotNone(s.stop(), "mpirun did not end on SIGTERM")
            if want is None:
                want = got
            else:
                self.assertEqual(got, want, layout)
        self.assertNotEqual(want[1], want[0], "the adapter changes nothing: the test would not see it missing")
        self.assertEqual(want[4], want[1])  # the adapter again after the swap back
        if os.path.realpath(other) != os.path.realpath(real_model()):
            self.assertNotEqual(want[2], want[3], "the swap changes nothing: the test would not see it missing")

    def check_rank_metrics(self, s):
        # /metrics per rank (sampled every 2 s): both stages ran the requests' tokens, and their
        # layers make the model's 5.
        deadline = time.time() + 20
        while True:
            with urllib.request.urlopen(s.url + "/metrics", timeout=TIMEOUT) as r:
                text = r.read().decode()
            m = {}
            for line in text.splitlines():
                if line.startswith("tern_rank_"):
                    name, value = line.rsplit(" ", 1)
                    m[name] = float(value)
            key = lambda n, r: '%s{rank="%d",stage="%d",tp_rank="0"}' % (n, r, r)
            if m.get(key("tern_rank_tokens_total", 1), 0) > 0 or time.time() > deadline:
                break
            time.sleep(0.5)
        for r in (0, 1):
            self.assertGreater(m.get(key("tern_rank_tokens_total", r), 0), 0, text)
            self.assertGreater(m[key("tern_rank_busy_seconds_total", r)], 0)
            self.assertGreater(m[key("tern_rank_weight_bytes", r)], 0)
        self.assertEqual(m[key("tern_rank_layer_begin", 0)], 0)
        self.assertEqual(m[key("tern_rank_layer_end", 0)], m[key("tern_rank_layer_begin", 1)])
        self.assertEqual(m[key("tern_rank_layer_end", 1)], 5)

    def test_pipeline_engines_serve_what_one_process_serves(self):
        # Concurrent requests over --pp 2's two pipeline engines (each step of one engine enters the
        # pipeline while the other's is in stage 1), and over one engine cut into micro-batches:
        # every answer is the single process's.
        prompts = ["Once upon a time", "The little dog", "Lily wanted to", "One day, a cat", "Tom and Sue",
                   "The sun was", "A big bird", "Mom said"]

        def concurrent(s):
            out = [None] * len(prompts)

            def one(i):
                out[i] = s.post("/v1/completions", {"prompt": prompts[i], "max_tokens": 32, "temperature": 0})
            threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
            for t in threads:
                t.start()
            for t in threads:
                t.join(TIMEOUT)
            for code, text in out:
                self.assertEqual(code, 200, text)
            return [json.loads(text)["choices"][0]["text"] for _, text in out]
        def collect(s):
            got = concurrent(s)
            if s.np:
                self.check_rank_metrics(s)
            return got
        self.layouts_agree(((0, []), (2, ["--pp", "2"]), (2, ["--pp", "2", "--pipeline-engines", "1"]),
                            (2, ["--pp", "2", "--pipeline-engines", "3", "--micro-batches", "2"])), [], collect)
        # Engines need a pipeline.
        r = subprocess.run([TERN, "serve", "-m", real_model(), "--pipeline-engines", "2", "--port", "0"],
                           capture_output=True, text=True, timeout=TIMEOUT)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("--pipeline-engines 2 needs a pipeline", r.stderr)

    def test_a_failed_pipeline_step_fails_its_request_alone(self):
        """Rank 0's stage of a pipelined step fails (injected: TERN_TEST_FAIL_PIPELINE_STEP) after
        its first micro-batch went on. The ranks finish that step on zeros, its request gets the
        error, and the next requests are answered as one process answers them: the later stage is
        neither left waiting for the rest of the step nor a step behind. Under one engine and
        under two (the pipeline engines' path)."""
        for engines in ("1", "2"):
            s = Server(2, ["--pp", "2", "--micro-batches", "2", "--pipeline-engines", engines, "--tbt-target-ms", "off"],
                       env={"TERN_TEST_FAIL_PIPELINE_STEP": "2"})
            try:
                code, text = s.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 24,
                                                        "temperature": 0})
                self.assertEqual(code, 500, text)
                self.assertIn("a failure injected into pipelined step 2", text)
                self.assertEqual(answers(s), self.want, engines)
            finally:
                rc = s.stop()
                self.assertIsNotNone(rc, "mpirun did not end on SIGTERM")

    def test_a_pool_with_a_layout_is_refused(self):
        r = subprocess.run([TERN, "serve", "-m", "a=" + real_model(), "-m", "b=" + real_model(), "--tp", "2",
                            "--port", "0"], capture_output=True, text=True, timeout=TIMEOUT)
        self.assertEqual(r.returncode, 1)
        self.assertIn("--tp / --pp serve one model", r.stderr)


if __name__ == "__main__":
    unittest.main()
