// Zero-work OpenAI-style streaming chat server for measuring load *clients*.
//
// Node's standard `http` module, one res.write per SSE event, chunks shaped like vLLM 0.32's
// (role delta, one content delta per token, a finish chunk, a usage chunk, [DONE]). It does no
// model work, so what a client reaches against it is the client's own ceiling (docs/lab.md: this
// server held 2,000 x 256-token streams at under 60% of one core).
//
// usage: node zero_work_server.js [port] [host]   -> prints {"port": N} on stdout when listening
// GET /stats -> {"requests": n, "cpu_user_ms": .., "cpu_system_ms": ..} (is the server the bottleneck?)
"use strict";
const http = require("http");

const port = parseInt(process.argv[2] || "0", 10);
const host = process.argv[3] || "127.0.0.1";
let requests = 0;
let seq = 0;

function promptTokens(body) {
  let n = 0;
  for (const m of body.messages || []) {
    const c = typeof m.content === "string" ? m.content : JSON.stringify(m.content || "");
    n += c.split(/\s+/).filter(Boolean).length;
  }
  return n;
}

function stream(res, body) {
  const id = "chatcmpl-" + (++seq);
  const model = body.model || "zero";
  const created = Math.floor(Date.now() / 1000);
  const maxTokens = body.max_completion_tokens || body.max_tokens || 16;
  const head = `data: {"id":"${id}","object":"chat.completion.chunk","created":${created},"model":"${model}","choices":[{"index":0,"delta":`;
  const tokenEvent = head + `{"content":" tok"},"logprobs":null,"finish_reason":null}]}\n\n`;
  res.writeHead(200, { "Content-Type": "text/event-stream", "Cache-Control": "no-cache" });
  res.write(head + `{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n`);
  let sent = 0;
  const finish = () => {
    res.write(head + `{"content":""},"logprobs":null,"finish_reason":"length","stop_reason":null}]}\n\n`);
    const pt = promptTokens(body);
    res.write(`data: {"id":"${id}","object":"chat.completion.chunk","created":${created},"model":"${model}","choices":[],"usage":{"prompt_tokens":${pt},"total_tokens":${pt + maxTokens},"completion_tokens":${maxTokens}}}\n\n`);
    res.end("data: [DONE]\n\n");
  };
  const pump = () => {
    while (sent < maxTokens) {
      sent++;
      if (!res.write(tokenEvent)) {
        res.once("drain", pump);
        return;
      }
    }
    finish();
  };
  pump();
}

const server = http.createServer((req, res) => {
  if (req.method === "GET" && req.url === "/stats") {
    const u = process.cpuUsage();
    res.writeHead(200, { "Content-Type": "application/json" });
    res.end(JSON.stringify({ requests, cpu_user_ms: u.user / 1000, cpu_system_ms: u.system / 1000 }));
    return;
  }
  if (req.method === "GET" && req.url === "/v1/models") {
    res.writeHead(200, { "Content-Type": "application/json" });
    res.end(JSON.stringify({ object: "list", data: [{ id: "zero", object: "model", max_model_len: 4096 }] }));
    return;
  }
  if (req.method !== "POST") {
    res.writeHead(404);
    res.end();
    return;
  }
  const parts = [];
  req.on("data", (c) => parts.push(c));
  req.on("end", () => {
    requests++;
    let body;
    try {
      body = JSON.parse(Buffer.concat(parts).toString() || "{}");
    } catch (e) {
      res.writeHead(400, { "Content-Type": "application/json" });
      res.end(JSON.stringify({ error: { message: "bad JSON", type: "BadRequestError", code: 400 } }));
      return;
    }
    stream(res, body);
  });
});
server.keepAliveTimeout = 60000;
server.listen(port, host, () => {
  process.stdout.write(JSON.stringify({ port: server.address().port }) + "\n");
});
process.on("SIGTERM", () => process.exit(0));
