// A rhea (npm) client for the AMQP 1.0 interop tests, driven by its arguments; it prints one line
// per message received ("message <body>") and per refusal ("error <condition> <description>").
//
//   node rhea_client.js selector HOST PORT ADDRESS SELECTOR
//       a receiver with the selector, then a sender of six messages (colour red / green, n 1..6);
//       prints what the receiver gets within a second and a half
//   node rhea_client.js durable HOST PORT ADDRESS CONTAINER LINK detach|close WAIT_MS
//       a durable receiver (durable unsettled-state, expiry-policy never) named LINK in container
//       CONTAINER; prints what it gets within WAIT_MS, then detaches (keeps the subscription) or
//       closes (unsubscribes)
"use strict";

const rhea = require("rhea");

const [mode, host, port, address, ...rest] = process.argv.slice(2);

function finish(connection, code) {
  connection.close();
  setTimeout(() => process.exit(code), 200);
}

if (mode === "selector") {
  const [selector] = rest;
  const container = rhea.create_container();
  const connection = container.connect({ host, port: Number(port), reconnect: false });
  const receiver = connection.open_receiver({ source: { address, filter: rhea.filter.selector(selector) } });
  receiver.on("message", (context) => console.log(`message ${context.message.body}`));
  receiver.on("receiver_error", (context) => {
    const error = context.receiver.error || {};
    console.log(`error ${error.condition} ${error.description}`);
    finish(connection, 0);
  });
  receiver.on("receiver_open", () => {
    const sender = connection.open_sender(address);
    sender.on("sendable", () => {
      for (let n = 1; n <= 6; n++) {
        const colour = n % 2 ? "red" : "green";
        sender.send({ body: `${colour} ${n}`, application_properties: { colour, n } });
      }
      sender.close();
    });
  });
  setTimeout(() => finish(connection, 0), 1500);
} else if (mode === "durable") {
  const [containerId, link, action, wait] = rest;
  const container = rhea.create_container({ id: containerId });
  const connection = container.connect({ host, port: Number(port), reconnect: false });
  const receiver = connection.open_receiver({
    name: link,
    source: { address, durable: 2, expiry_policy: "never" },
  });
  receiver.on("message", (context) => console.log(`message ${context.message.body}`));
  receiver.on("receiver_error", (context) => {
    const error = context.receiver.error || {};
    console.log(`error ${error.condition} ${error.description}`);
  });
  setTimeout(() => {
    if (action === "close") {
      receiver.close();
    } else {
      receiver.detach();
    }
    setTimeout(() => finish(connection, 0), 300);
  }, Number(wait));
} else {
  console.error(`unknown mode ${mode}`);
  process.exit(2);
}
