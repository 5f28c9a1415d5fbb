// Browser test of the chat page: headless Chromium (Debian's, driven by playwright-core)
// loads /, sends a message, and sees the answer stream in with its TTFT and tok/s.
//   TERN_BASE_URL   the server (started by run.sh with --api-key $TERN_TEST_API_KEY)
//   CHROMIUM        the browser binary (default /usr/bin/chromium)
//   TERN_SCREENSHOT optional: where to save a PNG of the page after the answer
import { test } from "node:test";
import assert from "node:assert/strict";
import { chromium } from "playwright-core";

const base = process.env.TERN_BASE_URL;

test("the chat page streams an answer", async () => {
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    // Root in a container has no user namespaces for Chromium's sandbox.
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  });
  try {
    const page = await browser.newPage();
    const external = [];
    page.on("request", (r) => {
      if (!r.url().startsWith(base)) external.push(r.url());
    });
    const pageErrors = [];
    page.on("pageerror", (e) => pageErrors.push(String(e)));

    await page.goto(base + "/");
    assert.equal(await page.title(), "tern chat");

    // The server wants a key: enter it in the settings, as a user would.
    await page.click("#toggle-settings");
    await page.fill("#api_key", process.env.TERN_TEST_API_KEY || "");
    await page.dispatchEvent("#api_key", "change");
    await page.fill("#max_tokens", "200");
    await page.dispatchEvent("#max_tokens", "change");
    await page.waitForFunction(() => document.querySelector("#model").textContent.includes("stories"));

    // Count how many times the answer's text changes while it streams in.
    await page.evaluate(() => {
      window.__updates = 0;
      new MutationObserver((records) => {
        for (const r of records) {
          const msg = r.target.nodeType === 1 ? r.target.closest(".msg.assistant") : r.target.parentElement?.closest(".msg.assistant");
          if (msg) window.__updates++;
        }
      }).observe(document.querySelector("#conversation"), { childList: true, subtree: true, characterData: true });
    });

    await page.fill("#prompt", "Once upon a time");
    await page.press("#prompt", "Enter");

    const answer = page.locator(".msg.assistant").last();
    await answer.waitFor();
    await page.waitForSelector(".msg.assistant[data-done='true']", { timeout: 60_000 });
    const text = await answer.locator(".text").textContent();
    assert.ok(text.trim().length > 0, "the answer has text");
    assert.equal(await answer.locator(".error").count(), 0);
    assert.equal(await page.locator(".msg.user .text").first().textContent(), "Once upon a time");

    const updates = await page.evaluate(() => window.__updates);
    assert.ok(updates > 3, `the answer appeared piece by piece (${updates} updates)`);

    const metrics = await answer.locator(".metrics").textContent();
    assert.match(metrics, /TTFT \d+ ms/);
    assert.match(metrics, /[\d.]+ tok\/s/);
    assert.match(metrics, /\d+ tokens/);

    // A second turn carries the conversation.
    await page.fill("#prompt", "And then?");
    await page.click("#send");
    await page.waitForFunction(() => document.querySelectorAll(".msg.assistant[data-done='true']").length === 2, null, { timeout: 60_000 });

    if (process.env.TERN_SCREENSHOT) await page.screenshot({ path: process.env.TERN_SCREENSHOT, fullPage: true });
    assert.deepEqual(external, [], "the page loads nothing from outside the server");
    assert.deepEqual(pageErrors, []);
  } finally {
    await browser.close();
  }
});

test("a page on another origin reaches the API only where --cors allows it", async () => {
  // run.sh starts the main server with --cors naming the other server's origin, and the
  // other one without --cors.
  const other = process.env.TERN_OTHER_URL;
  assert.ok(other, "TERN_OTHER_URL is set by run.sh");
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  });
  try {
    const page = await browser.newPage();
    // A call with a bearer key and a JSON body: the browser sends a preflight first.
    const call = (url) =>
      page.evaluate(
        async ([url, key]) => {
          try {
            const r = await fetch(url + "/v1/chat/completions", {
              method: "POST",
              headers: { Authorization: "Bearer " + key, "Content-Type": "application/json" },
              body: JSON.stringify({ messages: [{ role: "user", content: "Once" }], max_tokens: 4 }),
            });
            return { reached: true, status: r.status, object: (await r.json()).object };
          } catch (e) {
            return { reached: false, error: String(e) };
          }
        },
        [url, process.env.TERN_TEST_API_KEY || ""],
      );
    await page.goto(other + "/");
    const allowed = await call(base);
    assert.deepEqual(allowed, { reached: true, status: 200, object: "chat.completion" }, JSON.stringify(allowed));
    // From the main server's own page, the other server (no --cors) is out of reach.
    await page.goto(base + "/");
    const blocked = await call(other);
    assert.equal(blocked.reached, false, JSON.stringify(blocked));
  } finally {
    await browser.close();
  }
});

test("the chat page renders an answer's Markdown, and never a model's HTML", async () => {
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  });
  try {
    const page = await browser.newPage();
    const pageErrors = [];
    page.on("pageerror", (e) => pageErrors.push(String(e)));
    await page.goto(base + "/");
    const r = await page.evaluate(() => {
      window.__pwned = false;
      const md = [
        "# Title",
        "Some **bold**, *italic*, `x < y` and a [link](https://example.com/a) and [bad](javascript:window.__pwned=true).",
        "",
        "- one",
        "- two with `code`",
        "",
        "1. first",
        "2. second",
        "",
        "> quoted",
        "",
        "```python",
        "print('<b>not bold</b>')",
        "```",
        "",
        "<img src=x onerror=\"window.__pwned=true\"><script>window.__pwned=true</script>",
        "```",
        "unclosed fence while streaming",
      ].join("\n");
      const div = document.createElement("div");
      document.body.appendChild(div);
      window.ternMarkdown.renderInto(div, md);
      const q = (s) => div.querySelectorAll(s);
      return {
        h1: q("h1").length && q("h1")[0].textContent,
        strong: q("p strong").length && q("p strong")[0].textContent,
        em: q("p em").length && q("p em")[0].textContent,
        code: q("p code").length && q("p code")[0].textContent,
        links: Array.from(q("a")).map((a) => a.getAttribute("href")),
        ul: q("ul > li").length,
        ol: q("ol > li").length,
        quote: q("blockquote").length && q("blockquote")[0].textContent.trim(),
        pre: Array.from(q("pre > code")).map((c) => [c.className, c.textContent]),
        img: q("img").length,
        script: q("script").length,
        rawHtmlShownAsText: div.textContent.includes("<img src=x onerror="),
      };
    });
    assert.equal(r.h1, "Title");
    assert.equal(r.strong, "bold");
    assert.equal(r.em, "italic");
    assert.equal(r.code, "x < y");
    assert.deepEqual(r.links, ["https://example.com/a"], "only http(s)/mailto links become links");
    assert.equal(r.ul, 2);
    assert.equal(r.ol, 2);
    assert.equal(r.quote, "quoted");
    assert.deepEqual(r.pre, [["language-python", "print('<b>not bold</b>')"], ["", "unclosed fence while streaming"]]);
    assert.equal(r.img, 0);
    assert.equal(r.script, 0);
    assert.ok(r.rawHtmlShownAsText);
    await page.waitForTimeout(100);
    assert.equal(await page.evaluate(() => window.__pwned), false);
    assert.deepEqual(pageErrors, []);
  } finally {
    await browser.close();
  }
});
