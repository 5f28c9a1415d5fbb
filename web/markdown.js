// Markdown for the assistant's answers, rendered as DOM nodes (never through innerHTML), so
// whatever a model writes — <script>, <img onerror=...>, javascript: links — shows as text.
//
// Blocks: ``` fenced code (a language tag is kept as a class), # headings (1-6), > quotes,
// - * + bullet lists and 1. numbered lists (one level), --- rules, paragraphs (a single newline
// inside one is a line break). Inline: `code`, **bold** / __bold__, *italic* / _italic_,
// ~~strike~~, [text](http(s)/mailto URL) and bare http(s) URLs. An unclosed fence (an answer
// still streaming) renders as a code block up to the end, so the page does not jump.
"use strict";

(function () {
  const SAFE_URL = /^(https?:\/\/|mailto:)/i;

  function el(tag, cls) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    return e;
  }

  // Inline spans of one line of text into `parent`.
  function inline(parent, text) {
    // Order matters: code first (nothing inside it is markup), then links, then emphasis.
    const re = /(`+)([\s\S]*?[^`])\1(?!`)|\[([^\]\n]+)\]\(([^)\s]+)\)|(\*\*|__)(?=\S)([\s\S]*?\S)\5|(\*|_)(?=\S)([\s\S]*?\S)\7|~~(?=\S)([\s\S]*?\S)~~|(https?:\/\/[^\s<>()]+[^\s<>().,;:!?'"])/;
    let rest = text;
    while (rest.length) {
      const m = re.exec(rest);
      if (!m) { parent.appendChild(document.createTextNode(rest)); break; }
      if (m.index > 0) parent.appendChild(document.createTextNode(rest.slice(0, m.index)));
      if (m[1]) {
        const c = el("code");
        c.textContent = m[2].replace(/^ (.*) $/, "$1");
        parent.appendChild(c);
      } else if (m[3] !== undefined) {
        if (SAFE_URL.test(m[4])) {
          const a = el("a");
          a.href = m[4];
          a.rel = "noopener noreferrer";
          a.target = "_blank";
          inline(a, m[3]);
          parent.appendChild(a);
        } else {
          parent.appendChild(document.createTextNode(m[0]));  // not a link we follow
        }
      } else if (m[5]) {
        const b = el("strong");
        inline(b, m[6]);
        parent.appendChild(b);
      } else if (m[7]) {
        const i = el("em");
        inline(i, m[8]);
        parent.appendChild(i);
      } else if (m[9] !== undefined) {
        const s = el("del");
        inline(s, m[9]);
        parent.appendChild(s);
      } else if (m[10]) {
        const a = el("a");
        a.href = m[10];
        a.rel = "noopener noreferrer";
        a.target = "_blank";
        a.textContent = m[10];
        parent.appendChild(a);
      }
      rest = rest.slice(m.index + m[0].length);
    }
  }

  // Lines joined by line breaks, each with its inline spans.
  function inlineLines(parent, lines) {
    lines.forEach((line, i) => {
      if (i > 0) parent.appendChild(el("br"));
      inline(parent, line);
    });
  }

  function render(text) {
    const root = document.createDocumentFragment();
    const lines = String(text).replace(/\r\n?/g, "\n").split("\n");
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      const fence = /^\s{0,3}(```+|~~~+)\s*([\w+#.-]*)\s*$/.exec(line);
      if (fence) {
        const close = new RegExp("^\\s{0,3}" + fence[1][0] + "{" + fence[1].length + ",}\\s*$");
        const body = [];
        i++;
        while (i < lines.length && !close.test(lines[i])) body.push(lines[i++]);
        i++;  // the closing fence (or past the end while streaming)
        const pre = el("pre");
        const code = el("code", fence[2] ? "language-" + fence[2] : "");
        code.textContent = body.join("\n");
        pre.appendChild(code);
        root.appendChild(pre);
        continue;
      }
      if (/^\s*$/.test(line)) { i++; continue; }
      const heading = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/.exec(line);
      if (heading) {
        const h = el("h" + heading[1].length);
        inline(h, heading[2]);
        root.appendChild(h);
        i++;
        continue;
      }
      if (/^\s{0,3}([-*_])(\s*\1){2,}\s*$/.test(line)) {
        root.appendChild(el("hr"));
        i++;
        continue;
      }
      if (/^\s{0,3}>/.test(line)) {
        const quoted = [];
        while (i < lines.length && /^\s{0,3}>/.test(lines[i])) quoted.push(lines[i++].replace(/^\s{0,3}>\s?/, ""));
        const q = el("blockquote");
        q.appendChild(render(quoted.join("\n")));
        root.appendChild(q);
        continue;
      }
      const bullet = /^\s{0,3}([-*+]|\d{1,9}[.)])\s+/;
      const first = bullet.exec(line);
      if (first) {
        const ordered = /\d/.test(first[1]);
        const list = el(ordered ? "ol" : "ul");
        if (ordered && parseInt(first[1], 10) !== 1) list.start = parseInt(first[1], 10);
        while (i < lines.length) {
          const m = bullet.exec(lines[i]);
          if (!m || /\d/.test(m[1]) !== ordered) break;
          const item = [lines[i++].slice(m[0].length)];
          // Indented continuation lines belong to the item.
          while (i < lines.length && /^\s{2,}\S/.test(lines[i]) && !bullet.test(lines[i])) item.push(lines[i++].trim());
          const li = el("li");
          inlineLines(li, item);
          list.appendChild(li);
        }
        root.appendChild(list);
        continue;
      }
      const para = [];
      while (i < lines.length && !/^\s*$/.test(lines[i]) && !/^\s{0,3}(```|~~~|#{1,6}\s|>)/.test(lines[i]) &&
             !(para.length && bullet.test(lines[i]))) {
        para.push(lines[i++]);
      }
      const p = el("p");
      inlineLines(p, para);
      root.appendChild(p);
    }
    return root;
  }

  // Replaces node's children with the rendering of text.
  function renderInto(node, text) {
    node.replaceChildren(render(text));
  }

  window.ternMarkdown = { render, renderInto };
})();
