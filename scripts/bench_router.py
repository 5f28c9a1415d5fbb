#!/usr/bin/env python3
"""Load for a tern server's OpenAI API (one server or a `tern serve --replicas` router): ShareGPT
first turns as /v1/completions requests from C concurrent clients, each request with its own
max_tokens, ignore_eos so every request generates exactly that many. Prints requests/s, output
tok/s, failures and the latency percentiles; --json for a script. Standard library only; it only
talks to the URL given (a server of yours on this machine).

  python3 scripts/bench_router.py --url http://127.0.0.1:8080 --prompts sharegpt.json -n 64 -c 16
"""
import argparse
import json
import threading
import time
import urllib.error
import urllib.request


def first_turns(path, limit):
    data = json.load(open(path))
    out = []
    for item in data:
        conv = item.get("conversations") if isinstance(item, dict) else None
        if conv and isinstance(conv[0], dict) and isinstance(conv[0].get("value"), str) and conv[0]["value"]:
            out.append(conv[0]["value"][:2000])
        if len(out) >= limit:
            break
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("-n", "--num-prompts", type=int, default=64)
    ap.add_argument("-c", "--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    prompts = first_turns(a.prompts, a.num_prompts)
    lock = threading.Lock()
    nxt = [0]
    lat, tokens, failures = [], [0], [0]

    def worker():
        while True:
            with lock:
                if nxt[0] >= len(prompts):
                    return
                p = prompts[nxt[0]]
                nxt[0] += 1
            body = json.dumps({"prompt": p, "max_tokens": a.max_tokens, "temperature": 0, "ignore_eos": True}).encode()
            req = urllib.request.Request(a.url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
            t0 = time.time()
            try:
                with urllib.request.urlopen(req, timeout=a.timeout) as r:
                    j = json.loads(r.read())
                with lock:
                    lat.append(time.time() - t0)
                    tokens[0] += j.get("usage", {}).get("completion_tokens", 0)
            except (urllib.error.URLError, OSError, ValueError):
                with lock:
                    failures[0] += 1

    t0 = time.time()
    threads = [threading.Thread(target=worker) for _ in range(a.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.time() - t0
    lat.sort()
    pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] if lat else 0.0
    rep = {"requests": len(prompts), "failed": failures[0], "wall_s": wall, "req_s": len(lat) / wall,
           "output_tok_s": tokens[0] / wall, "latency_p50_s": pct(0.5), "latency_p90_s": pct(0.9)}
    if a.json:
        print(json.dumps(rep))
    else:
        print(f"{len(lat)} of {len(prompts)} requests in {wall:.1f} s ({failures[0]} failed): {rep['req_s']:.2f} req/s, "
              f"{rep['output_tok_s']:.1f} output tok/s, latency p50 {rep['latency_p50_s']:.2f} s p90 {rep['latency_p90_s']:.2f} s")


if __name__ == "__main__":
    main()
