// A real qlobber-fsq 14 peer for the interop tests: node qlobber_peer.js ROLE PARAMS_FILE
//
// PARAMS_FILE is JSON with at least {"dir": <bus root>}. qlobber-fsq runs with its default
// options (fsq_dir = the bus root). Everything the peer does is reported on stdout as one JSON
// object per line, so the test can wait on events instead of sleeping:
//   {"event": "ready"}                         started and subscribed (or ready to publish)
//   {"event": "published", "i": .., "fname": .., "expires": .., "single": ..}
//   {"event": "message", "sub": .., "topic": .., "single": .., "size": .., "fname": ..,
//    "expires": .., "payload": <base64>}       a handler was called
//   {"event": "done"}                          a publisher finished
//   {"event": "stopped"}                       stop_watching completed; the process exits 0
// The test writes "STOP\n" on stdin (or closes it) to stop a subscriber.
'use strict';

const fs = require('fs');
const { QlobberFSQ } = require('qlobber-fsq');

const role = process.argv[2];
const params = JSON.parse(fs.readFileSync(process.argv[3], 'utf8'));

function emit(obj) {
  process.stdout.write(JSON.stringify(obj) + '\n');
}

function open() {
  const fsq = new QlobberFSQ({ fsq_dir: params.dir });
  fsq.on('error', (err) => {
    emit({ event: 'error', message: String(err && err.stack ? err.stack : err) });
    process.exit(2);
  });
  fsq.on('single_disabled', (err) => {
    emit({ event: 'error', message: `work queues disabled (is fs-ext built?): ${err}` });
    process.exit(2);
  });
  return fsq;
}

function stopOnRequest(fsq) {
  let stopping = false;
  const stop = () => {
    if (stopping) return;
    stopping = true;
    fsq.stop_watching(() => {
      emit({ event: 'stopped' });
      process.exit(0);
    });
  };
  process.stdin.on('data', (d) => { if (d.toString().includes('STOP')) stop(); });
  process.stdin.on('end', stop);
}

// Publish params.messages ([{topic, payload (base64), single, ttl}]) one after another,
// so the order of "published" lines is the order of the list. With params.pause_at = k,
// it stops before message k ({"event": "paused"}) until a line "GO" comes on stdin.
function pub() {
  const fsq = open();
  fsq.on('start', () => {
    emit({ event: 'ready' });
    const messages = params.messages;
    let i = 0;
    let resumed = false;
    const next = () => {
      if (i >= messages.length) {
        emit({ event: 'done' });
        fsq.stop_watching(() => {
          emit({ event: 'stopped' });
          process.exit(0);
        });
        return;
      }
      if (i === params.pause_at && !resumed) {
        // wait for "GO" on stdin (the test does something between the two parts)
        emit({ event: 'paused', i });
        process.stdin.once('data', (d) => {
          if (d.toString().includes('GO')) { resumed = true; next(); }
        });
        return;
      }
      const m = messages[i];
      const options = { single: !!m.single };
      if (m.ttl) options.ttl = m.ttl;
      fsq.publish(m.topic, Buffer.from(m.payload, 'base64'), options, (err, info) => {
        if (err) {
          emit({ event: 'error', message: String(err.stack || err) });
          process.exit(2);
        }
        emit({ event: 'published', i, fname: info.fname, expires: info.expires, single: info.single });
        i += 1;
        next();
      });
    };
    next();
  });
}

// Subscribe params.subscriptions ([{id, pattern, hold, existing}]), one handler per entry so
// that qlobber-fsq's per-handler dedup keeps them apart. Single messages are acknowledged by
// calling done() once the line is written, unless the subscription says hold: then the
// handler never finishes and qlobber-fsq keeps the message locked until the process dies.
// existing: also deliver unexpired messages already there (subscribe_to_existing).
function sub() {
  const fsq = open();
  const subs = params.subscriptions;
  let pending = subs.length;
  const handlerFor = (id, hold) => (data, info, done) => {
    emit({
      event: 'message',
      sub: id,
      topic: info.topic,
      single: info.single,
      size: info.size,
      fname: info.fname,
      expires: info.expires,
      payload: data.toString('base64'),
    });
    if (done && !hold) done();
  };
  fsq.on('start', () => {
    for (const s of subs) {
      const options = { subscribe_to_existing: !!s.existing };
      fsq.subscribe(s.pattern, handlerFor(s.id, !!s.hold), options, () => {
        pending -= 1;
        if (pending === 0) emit({ event: 'ready' });
      });
    }
  });
  stopOnRequest(fsq);
}

const roles = { pub, sub };
if (!roles[role]) {
  emit({ event: 'error', message: `unknown role ${role}` });
  process.exit(2);
}
roles[role]();
