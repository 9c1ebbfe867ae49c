// The node-redlock peer of lock-redis/tests/legacy.rs: npm `redlock` 4.2.0
// (with an ioredis 4 client per server) as a process.
//
// argv: <ttl ms> <host:port>... (one server, or several for Redlock).
// Prints "ready" once every client is connected, then reads commands on
// stdin, one a line, and answers each with one line:
//
//   try <key>          -> ok <value> | busy      redlock.lock, retryCount 0
//   wait <key> <ms>    -> ok <value> | busy      redlock.lock, retries for ms
//   extend <key>       -> ok | failed            lock.extend(ttl)
//   release <key>      -> released | not-held    lock.unlock()
//   exit
//
// <value> is the random hex redlock stored at <key>. Errors are answered
// ("error ..."), never a hang.
'use strict';

const readline = require('readline');
const Redis = require('ioredis');
const Redlock = require('redlock');

const RETRY_DELAY = 20;
const ttl = Number(process.argv[2]);
const clients = process.argv.slice(3).map((address) => {
  const [host, port] = address.split(':');
  return new Redis({ host, port: Number(port), maxRetriesPerRequest: 1, lazyConnect: true });
});
const options = { driftFactor: 0.01, retryDelay: RETRY_DELAY, retryJitter: 5 };
// `lock(resource, ttl)` reads `options.retryCount || self.retryCount`, so
// a single try needs an instance of its own.
const once = new Redlock(clients, { ...options, retryCount: 0 });
const held = new Map();

async function answer(words) {
  const [cmd, key] = words;
  if (cmd === 'try' || cmd === 'wait') {
    const redlock = cmd === 'try'
      ? once
      : new Redlock(clients, {
        ...options,
        retryCount: Math.max(1, Math.floor(Number(words[2]) / RETRY_DELAY)),
      });
    try {
      const lock = await redlock.lock(key, ttl);
      held.set(key, lock);
      return 'ok ' + lock.value;
    } catch (e) {
      if (e instanceof Redlock.LockError) return 'busy';
      throw e;
    }
  }
  if (cmd === 'extend') {
    const lock = held.get(key);
    if (!lock) return 'failed';
    try {
      held.set(key, await lock.extend(ttl));
      return 'ok';
    } catch (e) {
      if (e instanceof Redlock.LockError) return 'failed';
      throw e;
    }
  }
  if (cmd === 'release') {
    const lock = held.get(key);
    held.delete(key);
    if (!lock) return 'not-held';
    try {
      await lock.unlock();
      return 'released';
    } catch (e) {
      if (e instanceof Redlock.LockError) return 'not-held';
      throw e;
    }
  }
  return 'error unknown command ' + cmd;
}

async function main() {
  await Promise.all(clients.map((c) => c.connect()));
  console.log('ready');
  const lines = readline.createInterface({ input: process.stdin });
  for await (const line of lines) {
    const words = line.trim().split(/\s+/);
    if (!words[0]) continue;
    if (words[0] === 'exit') break;
    let reply;
    try {
      reply = await answer(words);
    } catch (e) {
      reply = 'error ' + String(e && e.message ? e.message : e).replace(/\n/g, ' ');
    }
    console.log(reply);
  }
  clients.forEach((c) => c.disconnect());
}

main().catch((e) => {
  console.log('error ' + e);
  process.exit(1);
});
