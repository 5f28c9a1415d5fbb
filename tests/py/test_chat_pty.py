"""`tern chat` driven through a pseudo-terminal (stdlib pty), checked against `tern serve`:

(a) a multi-turn conversation with --system at temperature 0 gives, turn by turn, the reply text,
    reply token count and prompt token count of the same messages sent to /v1/chat/completions
    (the earlier assistant turns being chat's own replies), with the K/V of the shared prefix kept;
(b) Ctrl-C (\\x03 through the pty) stops a long reply, the program goes on, the partial reply is
    in the conversation, the next turn works; Ctrl-C at the prompt exits with 130;
(c) /save, /reset, /load restores the conversation: the next reply is the one without the reset;
(d) a bad /load (garbage, no file, wrong shape) is a clear error and the conversation is untouched;
    a failed /save is an error too;
(e) `tern run -f -` with the prompt on stdin equals `tern run -p`; `tern run -i` and `tern chat`
    with stdin a pipe (no prompt decoration) give the pty's replies;
(f) a conversation that outgrows the context drops its oldest turns, keeps the system prompt, says
    so, and still answers as the server answers the messages kept; multi-line input.
Model: ../shared's stories260K (F32) when present, else the repo's own models/tern-stories.gguf.
Every wait is bounded. Exit code 77 = skipped (no tern binary or no model)."""
import errno
import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

TERN = os.environ.get("TERN_BINARY", "tern")
if not (os.path.exists(TERN) or shutil.which(TERN)):
    print(f"SKIP: no tern binary at {TERN}")
    sys.exit(77)
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SHARED = os.environ.get("TERN_SHARED_DIR") or os.path.join(os.path.dirname(REPO), "shared")
MODEL = os.path.join(SHARED, "models", "stories260K.gguf")
if not os.path.exists(MODEL):
    MODEL = os.path.join(REPO, "models", "tern-stories.gguf")
if not os.path.exists(MODEL):
    print("SKIP: neither ../shared/models/stories260K.gguf nor models/tern-stories.gguf")
    sys.exit(77)
print(f"model: {MODEL}")



def on_alarm(signum, frame):
    raise TimeoutError("the whole test ran past 900 s")


signal.signal(signal.SIGALRM, on_alarm)
signal.alarm(900)  # a last bound on the whole test (the children are still cleaned up), beside each wait's own
failures = 0


def check(cond, what):
    global failures
    print(("ok   " if cond else "FAIL ") + what)
    failures += not cond
    return cond


METRICS = re.compile(rb"\[reply (\d+) tokens \((\w+)\) \| prompt (\d+) new \+ (\d+) cached \| TTFT [\d.]+ ms \| "
                     rb"[\d.]+ tok/s[^\]\r\n]*\]\r?\n")
PROMPT = b"> "


class PtyChat:
    """tern chat on the slave side of a pty; this side types and reads the screen."""

    def __init__(self, args):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            try:
                os.execv(TERN, [TERN, "chat", *args])
            finally:
                os._exit(127)
        self.buf = b""
        self.status = None

    def _fill(self, deadline):
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        r, _, _ = select.select([self.fd], [], [], min(left, 1.0))
        if r:
            try:
                data = os.read(self.fd, 65536)
            except OSError as e:  # EIO: the child closed the terminal
                if e.errno != errno.EIO:
                    raise
                data = b""
            if not data:
                self.poll_exit()
                if self.status is not None:
                    return False
                time.sleep(0.05)
            self.buf += data
        return True

    def read_until(self, pattern, start, timeout=60):
        """First match of `pattern` (bytes regex) in the output from offset `start`."""
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern) if isinstance(pattern, bytes) else pattern
        while True:
            m = rx.search(self.buf, start)
            if m:
                return m
            if not self._fill(deadline):
                m = rx.search(self.buf, start)
                if m:
                    return m
                tail = self.buf[start:][-600:]
                raise TimeoutError(f"waited for {rx.pattern!r}; output so far ends with {tail!r}")

    def read_bytes(self, n, start, timeout=60):
        deadline = time.monotonic() + timeout
        while len(self.buf) - start < n:
            if not self._fill(deadline):
                raise TimeoutError(f"waited for {n} bytes, got {len(self.buf) - start}")

    def send(self, data):
        os.write(self.fd, data)

    def start(self, timeout=60):
        return self.read_until(rb"Ctrl-D exits\r?\n> ", 0, timeout)

    def line(self, text, done=None, timeout=60):
        """Types a line (Enter), waits for `done` (default: the next prompt); returns what came."""
        start = len(self.buf)
        self.send(text.encode() + b"\r")
        m = self.read_until(done or rb"\r?\n> ", start + len(text), timeout)
        return self.buf[start:m.end()].replace(b"\r\n", b"\n")

    def turn(self, text, timeout=120):
        """Sends a one-line message; returns (reply text, tokens, finish, new, cached, notes)."""
        start = len(self.buf)
        self.send(text.encode() + b"\r")
        m = self.read_until(METRICS.pattern + rb"> ", start, timeout)
        seg = self.buf[start:m.start()].replace(b"\r\n", b"\n")
        echo = text.encode() + b"\n"
        if not seg.startswith(echo):
            raise AssertionError(f"no echo of {text!r} in {seg[:200]!r}")
        seg = seg[len(echo):]
        notes = []
        while seg.startswith(b"tern chat: "):
            nl = seg.index(b"\n")
            notes.append(seg[:nl].decode())
            seg = seg[nl + 1:]
        if not seg.endswith(b"\n"):
            raise AssertionError(f"reply does not end with a newline: {seg[-100:]!r}")
        mm = METRICS.match(self.buf, m.start())
        return (seg[:-1].decode("utf-8"), int(mm.group(1)), mm.group(2).decode(), int(mm.group(3)),
                int(mm.group(4)), notes)

    def poll_exit(self):
        if self.status is None:
            pid, st = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(st)
        return self.status

    def wait_exit(self, timeout=30):
        deadline = time.monotonic() + timeout
        while self.poll_exit() is None and time.monotonic() < deadline:
            self._fill(min(deadline, time.monotonic() + 0.2))
        return self.status

    def kill(self):
        if self.poll_exit() is None:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            self.status = -9
        os.close(self.fd)


class Server:
    def __init__(self, args):
        self.p = subprocess.Popen([TERN, "serve", "-m", MODEL, "--host", "127.0.0.1", "--port", "0", *args],
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        err = b""
        self.port = None
        while time.monotonic() < deadline and self.port is None:
            r, _, _ = select.select([self.p.stderr], [], [], 1.0)
            if r:
                chunk = os.read(self.p.stderr.fileno(), 4096)
                if not chunk:
                    break
                err += chunk
                m = re.search(rb"listening on http://127\.0\.0\.1:(\d+)", err)
                if m:
                    self.port = int(m.group(1))
        if self.port is None:
            self.stop()
            raise RuntimeError(f"tern serve did not start: {err.decode(errors='replace')[-500:]}")

    def chat(self, messages, max_tokens, sampling=None):
        body = json.dumps({"messages": messages, "max_completion_tokens": max_tokens, "logprobs": True,
                           **(sampling or {"temperature": 0})}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


def compare_with_server(server, msgs, reply, n_tokens, finish, n_prompt, n_max, what, sampling=None):
    j = server.chat(msgs, n_max, sampling)
    c = j["choices"][0]
    content = c["message"]["content"]
    usage = j["usage"]
    lp = (c.get("logprobs") or {}).get("content") or []
    ok = check(content == reply, f"{what}: reply text equals the server's ({len(reply)} chars)")
    if not ok:
        print(f"     chat:   {reply!r}\n     server: {content!r}")
    check(usage["completion_tokens"] == n_tokens and len(lp) == n_tokens,
          f"{what}: {n_tokens} reply tokens, server {usage['completion_tokens']} ({len(lp)} logprob entries)")
    check(usage["prompt_tokens"] == n_prompt, f"{what}: prompt {n_prompt} tokens, server {usage['prompt_tokens']}")
    check(c["finish_reason"] == finish, f"{what}: finish {finish}, server {c['finish_reason']}")
    return j


CTX = "1024"
N = 24
SYSTEM = "You are a storyteller for small children."
TURNS = ["Once upon a time there was a little cat.", "What did the cat do next?", "Tell me how the story ends."]
COMMON = ["-m", MODEL, "-t", "1", "--ctx", CTX, "--temp", "0"]

tmp = tempfile.mkdtemp(prefix="tern_chat_test_")
server = None
chats = []
try:
    server = Server(["-t", "1", "--ctx", CTX])

    # ---- (a) multi-turn with a system prompt == the server; (c) /save /reset /load ----
    c = PtyChat([*COMMON, "-n", str(N), "--system", SYSTEM])
    chats.append(c)
    c.start()
    msgs = [{"role": "system", "content": SYSTEM}]
    replies = []
    prev_prompt = 0
    for i, u in enumerate(TURNS):
        if i == 2:
            out = c.line(f"/save {tmp}/two.json")
            check(b"saved 5 messages" in out, f"/save after two turns ({out[-80:]!r})")
        reply, n_tok, finish, new, cached, _ = c.turn(u)
        msgs.append({"role": "user", "content": u})
        compare_with_server(server, msgs, reply, n_tok, finish, new + cached, N, f"turn {i + 1}")
        if i > 0:
            check(0 < cached <= prev_prompt, f"turn {i + 1}: {cached} prompt tokens kept from the previous turn's "
                                             f"{prev_prompt}, {new} prefilled")
        prev_prompt = new + cached
        msgs.append({"role": "assistant", "content": reply})
        replies.append(reply)
    saved = json.load(open(f"{tmp}/two.json"))
    check(saved.get("format") == "tern-chat" and saved.get("model") == MODEL and "settings" in saved,
          "the saved file names its format, the model and the settings")
    check(saved["messages"] == msgs[:5], "the saved messages are the system prompt and the first two turns")

    out = c.line("/reset")
    check(b"cleared" in out, "/reset")
    r1, *_ = c.turn(TURNS[0])
    check(r1 == replies[0], "after /reset the first message gets the first reply again")
    out = c.line(f"/load {tmp}/two.json")
    check(b"loaded 5 messages" in out, f"/load ({out[-80:]!r})")
    r3, *_ = c.turn(TURNS[2])
    check(r3 == replies[2], "/save, /reset, /load: the third reply equals the one without the reset")

    # a seeded sampler at temperature 0.8: each reply is the server's with that seed
    SAMPLING = {"temperature": 0.8, "seed": 42, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
    c2 = PtyChat(["-m", MODEL, "-t", "1", "--ctx", CTX, "-n", str(N), "--system", SYSTEM, "--temp", "0.8",
                  "--seed", "42", "--top-k", "40", "--top-p", "0.95", "--min-p", "0.05"])
    chats.append(c2)
    c2.start()
    smsgs = [{"role": "system", "content": SYSTEM}]
    for i, u in enumerate(TURNS[:2]):
        reply, n_tok, finish, new, cached, _ = c2.turn(u)
        smsgs.append({"role": "user", "content": u})
        compare_with_server(server, smsgs, reply, n_tok, finish, new + cached, N, f"seeded turn {i + 1}", SAMPLING)
        smsgs.append({"role": "assistant", "content": reply})
    c2.send(b"/exit\r")
    c2.wait_exit()

    # ---- (d) bad files: clear errors, conversation untouched ----
    c.line(f"/save {tmp}/before.json")
    open(f"{tmp}/garbage.json", "wb").write(b"\x00\xffnot json {")
    open(f"{tmp}/shape.json", "w").write(json.dumps({"messages": [{"role": "user"}]}))
    open(f"{tmp}/open.json", "w").write(json.dumps({"messages": [{"role": "user", "content": "hi"}]}))
    open(f"{tmp}/role.json", "w").write(json.dumps({"messages": [{"role": "wizard", "content": "hi"}]}))
    for name, expect in [("garbage.json", b"is not JSON"), ("missing.json", b"cannot open"),
                         ("shape.json", b"is not {\"role\""), ("open.json", b"with no reply"),
                         ("role.json", b"has role \"wizard\""), ("", b"needs a file name")]:
        out = c.line(f"/load {tmp}/{name}" if name else "/load")
        check(b"tern chat: error: " in out and expect in out, f"/load {name or '(none)'}: {out.strip()[-120:]!r}")
    for bad, expect in [("/dev/full", b"No space left"), (tmp, b"directory")]:
        out = c.line(f"/save {bad}")
        check(b"tern chat: error: " in out and expect in out, f"/save {bad}: {out.strip()[-100:]!r}")
    out = c.line("/frobnicate")
    check(b"unknown command /frobnicate" in out, "an unknown command is an error")
    out = c.line("/set temp hot")
    check(b"is not a number" in out, "/set with a bad value is an error")
    c.line(f"/save {tmp}/after.json")
    check(json.load(open(f"{tmp}/before.json"))["messages"] == json.load(open(f"{tmp}/after.json"))["messages"],
          "the failed commands left the conversation as it was")
    check(json.load(open(f"{tmp}/before.json"))["messages"][-1]["content"] == replies[2],
          "it ends with the third reply")
    reply, n_tok, finish, new, cached, _ = c.turn("And then?")
    hist = json.load(open(f"{tmp}/after.json"))["messages"] + [{"role": "user", "content": "And then?"}]
    compare_with_server(server, hist, reply, n_tok, finish, new + cached, N, "a turn after the failed commands")

    # multi-line input: a """ block and a trailing backslash
    c.line('"""', done=rb"\.\.\. ")
    c.line("first line", done=rb"\.\.\. ")
    c.line("second line", done=rb"\.\.\. ")
    c.line('"""', done=METRICS.pattern + rb"> ")
    c.line("left \\", done=rb"\.\.\. ")
    c.line("right", done=METRICS.pattern + rb"> ")
    c.line(f"/save {tmp}/multi.json")
    m = json.load(open(f"{tmp}/multi.json"))["messages"]
    check(m[-4]["content"] == "first line\nsecond line", f'a """ block is one message of two lines ({m[-4]["content"]!r})')
    check(m[-2]["content"] == "left \nright", f"a trailing backslash continues the message ({m[-2]['content']!r})")

    c.send(b"\x04")
    check(c.wait_exit() == 0, f"Ctrl-D at the prompt exits with 0 (status {c.status})")

    # ---- (b) Ctrl-C stops a long reply; the program goes on ----
    LONG = ["-m", MODEL, "-t", "1", "--ctx", "65536", "--temp", "0", "-n", "60000", "--ignore-eos"]
    c = PtyChat(LONG)
    chats.append(c)
    c.start()
    start = len(c.buf)
    c.send(b"Once upon a time\r")
    c.read_bytes(400, start, timeout=60)
    t_int = time.monotonic()
    c.send(b"\x03")
    m = c.read_until(METRICS.pattern + rb"> ", start, timeout=30)
    mm = METRICS.match(c.buf, m.start())
    check(mm.group(2) == b"interrupted" and int(mm.group(1)) < 60000,
          f"Ctrl-C stopped the reply after {int(mm.group(1))} of 60000 tokens, "
          f"{time.monotonic() - t_int:.2f} s after it was sent")
    check(c.poll_exit() is None, "the program is still running")
    partial = c.buf[start:m.start()].replace(b"\r\n", b"\n")
    out = c.line("/set n 8")
    check(b"n = 8" in out, "/set n 8")
    reply, n_tok, finish, new, cached, _ = c.turn("The end.")
    check(n_tok == 8 and finish == "length" and reply, f"the next turn works ({n_tok} tokens, {finish}: {reply!r})")
    c.line(f"/save {tmp}/int.json")
    m = json.load(open(f"{tmp}/int.json"))["messages"]
    # The first 300 bytes of the reply were on the screen before Ctrl-C (the terminal then
    # echoes ^C and drops output it still held, so compare no further).
    shown = partial[len(b"Once upon a time\n"):][:300].decode("utf-8", "replace")
    check(len(m) == 4 and m[1]["role"] == "assistant" and len(m[1]["content"]) >= 300 and
          m[1]["content"].startswith(shown),
          f"the partial reply ({len(m[1]['content'])} chars) stays in the conversation")
    # Ctrl-C in a """ block drops the block, not the program.
    c.line('"""', done=rb"\.\.\. ")
    c.line("never sent", done=rb"\.\.\. ")
    start = len(c.buf)
    c.send(b"\x03")
    c.read_until(rb"\(input discarded\)\r?\n> ", start, timeout=30)
    check(c.poll_exit() is None, "Ctrl-C in a multi-line block discards it and the program goes on")
    c.line(f"/save {tmp}/int2.json")
    check(len(json.load(open(f"{tmp}/int2.json"))["messages"]) == 4, "the discarded block was not sent")
    c.send(b"\x03")
    check(c.wait_exit() == 130, f"Ctrl-C at the prompt exits with 130 (status {c.status})")

    # Ctrl-C twice quickly during a reply exits at once.
    c = PtyChat(LONG)
    chats.append(c)
    c.start()
    start = len(c.buf)
    c.send(b"Once upon a time\r")
    c.read_bytes(200, start, timeout=60)
    c.send(b"\x03")  # (two in one write would merge into one pending SIGINT)
    time.sleep(0.1)
    c.send(b"\x03")
    check(c.wait_exit(10) == 130, f"Ctrl-C twice quickly during a reply exits with 130 (status {c.status})")

    # ---- (f) the context overflows: the oldest turns go, the system prompt stays ----
    c = PtyChat(["-m", MODEL, "-t", "1", "--ctx", "160", "--temp", "0", "-n", "32", "--system", "Stories."])
    chats.append(c)
    c.start()
    dropped = None
    for i in range(8):
        reply, n_tok, finish, new, cached, notes = c.turn(f"Tell me story number {i + 1}.")
        if any("dropped the oldest" in n for n in notes):
            dropped = (i, reply, n_tok, finish, new + cached, notes)
            break
    if check(dropped is not None, "a long conversation drops its oldest turns and says so"):
        i, reply, n_tok, finish, n_prompt, notes = dropped
        print(f"     turn {i + 1}: {notes[0]}")
        c.line(f"/save {tmp}/ctx.json")
        kept = json.load(open(f"{tmp}/ctx.json"))["messages"]
        check(kept[0] == {"role": "system", "content": "Stories."} and len(kept) < 2 * (i + 1) + 1,
              f"the system prompt is kept, {len(kept)} of {2 * (i + 1) + 1} messages")
        compare_with_server(server, kept[:-1], reply, n_tok, finish, n_prompt, 32, "after dropping turns")
    c.send(b"/exit\r")
    check(c.wait_exit() == 0, "/exit")

    # ---- (e) stdin that is not a terminal; run -f -; run -i ----
    env = dict(os.environ)
    p = subprocess.run([TERN, "chat", *COMMON, "-n", str(N), "--system", SYSTEM, "--no-metrics"],
                       input="\n".join(TURNS[:2]) + "\n", capture_output=True, text=True, timeout=120, env=env)
    check(p.returncode == 0 and p.stdout == replies[0] + "\n" + replies[1] + "\n",
          f"chat with stdin a pipe prints the replies only (rc {p.returncode}, {p.stdout[:60]!r})")
    check("[reply" not in p.stderr, "--no-metrics")
    p = subprocess.run([TERN, "run", "-i", *COMMON, "-n", str(N), "--system", SYSTEM, "-p", TURNS[0]],
                       input=TURNS[1] + "\n", capture_output=True, text=True, timeout=120)
    check(p.returncode == 0 and p.stdout == replies[0] + "\n" + replies[1] + "\n",
          f"run -i -p: the same conversation (rc {p.returncode}: {p.stderr.strip()[-200:]})")
    # A grammar constrains every reply, each from the grammar's start (run -i and chat alike).
    g = 'root ::= "The cat " ("sat" | "ran" | "slept") "."'
    for cmd in (["chat"], ["run", "-i"]):
        p = subprocess.run([TERN, *cmd, *COMMON, "--temp", "1", "-s", "3", "-n", "40", "--no-metrics", "--grammar", g],
                           input="\n".join(TURNS) + "\n", capture_output=True, text=True, timeout=120)
        lines = p.stdout.split("\n")[:-1]
        check(p.returncode == 0 and len(lines) == 3 and all(l in ("The cat sat.", "The cat ran.", "The cat slept.") for l in lines),
              f"{' '.join(cmd)} --grammar: every reply is one match ({lines}, rc {p.returncode}: {p.stderr.strip()[-200:]})")
    p = subprocess.run([TERN, "chat", *COMMON, "-n", "40", "--no-metrics", "--json-schema",
                        '{"type": "integer", "minimum": 1, "maximum": 12}'],
                       input=TURNS[0] + "\n", capture_output=True, text=True, timeout=120)
    check(p.returncode == 0 and p.stdout.strip().isdigit() and 1 <= int(p.stdout.strip()) <= 12,
          f"chat --json-schema: an integer in [1, 12] ({p.stdout!r}, rc {p.returncode}: {p.stderr.strip()[-200:]})")
    p = subprocess.run([TERN, "chat", *COMMON, "--grammar", "root ::= ("], input="", capture_output=True, text=True, timeout=30)
    check(p.returncode != 0 and "grammar" in p.stderr, f"chat with a bad grammar is an error (rc {p.returncode}: {p.stderr.strip()[-120:]})")
    prompt = "Once upon a time, a little"
    a = subprocess.run([TERN, "run", "-m", MODEL, "-t", "1", "--temp", "0", "-n", "20", "--json", "-f", "-"],
                       input=prompt, capture_output=True, text=True, timeout=60)
    b = subprocess.run([TERN, "run", "-m", MODEL, "-t", "1", "--temp", "0", "-n", "20", "--json", "-p", prompt],
                       capture_output=True, text=True, timeout=60)
    ja, jb = json.loads(a.stdout), json.loads(b.stdout)
    check(a.returncode == 0 and ja["prompt_ids"] == jb["prompt_ids"] and ja["ids"] == jb["ids"] and ja["text"] == jb["text"],
          f"run -f - equals run -p ({len(ja['ids'])} tokens)")
    p = subprocess.run([TERN, "chat", "-m", MODEL, "--load-nothing"], capture_output=True, text=True, timeout=30)
    check(p.returncode == 2, f"a bad flag is a usage error (rc {p.returncode})")
    p = subprocess.run([TERN, "chat", "-m", f"{tmp}/garbage.json"], capture_output=True, text=True, timeout=30)
    check(p.returncode == 1 and "error" in p.stderr, f"a bad model file is an error (rc {p.returncode})")
except (TimeoutError, AssertionError, RuntimeError, OSError, ValueError, KeyError) as e:
    check(False, f"{type(e).__name__}: {e}")
finally:
    for c in chats:
        c.kill()
    if server:
        server.stop()
    shutil.rmtree(tmp, ignore_errors=True)

print("FAILED" if failures else "PASSED", f"({failures} failures)")
sys.exit(1 if failures else 0)
