// Node's amqplib against an AMQP 0-9-1 broker (the fsbus gateway or RabbitMQ), for
// tests/amqp_gateway/test_clients.py:
//
//   node amqplib_client.js AMQP_URL QUEUE [COUNT]
//
// asserts QUEUE, sends COUNT messages (default 10) on a confirm channel and waits for
// the confirms, consumes them on another channel (prefetch 3, acking each), waits for
// the queue to count no message, deletes it. Prints one JSON object per line:
// connected, asserted, sent, one received per message, done; or error (exit 1), or
// timeout (exit 2).
"use strict";

const path = require("node:path");

// amqplib lives in tests/interop/node_modules (npm install there)
const amqp = require(
  require.resolve("amqplib", { paths: [path.join(__dirname, "..", "interop")] }),
);

const TIMEOUT_MS = 30000;

function emit(event, fields) {
  process.stdout.write(`${JSON.stringify({ event, ...fields })}\n`);
}

async function main() {
  const [url, queue, countArg] = process.argv.slice(2);
  if (!url || !queue) {
    throw new Error("usage: node amqplib_client.js AMQP_URL QUEUE [COUNT]");
  }
  const count = Number(countArg || 10);
  const conn = await amqp.connect(url);
  emit("connected", { product: conn.connection.serverProperties.product || null });
  try {
    const pub = await conn.createConfirmChannel();
    const ok = await pub.assertQueue(queue, { durable: true });
    emit("asserted", { queue: ok.queue, messageCount: ok.messageCount });
    for (let i = 0; i < count; i++) {
      pub.sendToQueue(queue, Buffer.from(`message ${i}`), {
        persistent: true,
        messageId: `m${i}`,
        contentType: "text/plain",
        headers: { i },
      });
    }
    await pub.waitForConfirms();
    emit("sent", { n: count });

    const sub = await conn.createChannel();
    await sub.prefetch(3);
    let received = 0;
    await new Promise((resolve, reject) => {
      sub
        .consume(queue, (msg) => {
          if (msg === null) {
            reject(new Error("consumer cancelled by the server"));
            return;
          }
          emit("received", {
            body: msg.content.toString(),
            messageId: msg.properties.messageId,
            contentType: msg.properties.contentType,
            headers: msg.properties.headers,
            redelivered: msg.fields.redelivered,
          });
          sub.ack(msg);
          received += 1;
          if (received === count) {
            resolve();
          }
        })
        .catch(reject);
    });
    // RabbitMQ counts 0 as soon as the last ack is in; the fsbus gateway may still
    // count messages whose ack it is writing, for a moment: ask until 0 (or 10 s)
    let left = await sub.checkQueue(queue);
    const deadline = Date.now() + 10000;
    while (left.messageCount !== 0 && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 50));
      left = await sub.checkQueue(queue);
    }
    await sub.deleteQueue(queue);
    await sub.close();
    await pub.close();
    emit("done", { received, messageCount: left.messageCount });
  } finally {
    await conn.close();
  }
}

const timer = setTimeout(() => {
  emit("timeout", { ms: TIMEOUT_MS });
  process.exit(2);
}, TIMEOUT_MS);

main().then(
  () => clearTimeout(timer),
  (err) => {
    emit("error", { message: String(err && err.stack ? err.stack : err) });
    process.exit(1);
  },
);
