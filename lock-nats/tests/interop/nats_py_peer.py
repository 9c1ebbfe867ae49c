"""The nats-py peer of lock-nats/tests/interop.rs: nats-py's own KV
`create` on the same bucket, as a process.

argv: <server url> <bucket>. Prints "ready" once connected, then reads
commands on stdin, one a line, and answers each with one line:

  create <kv key>   -> ok <revision> | exists    kv.create(key, b"nats-py-peer")
  delete <kv key>   -> deleted                   kv.delete(key)
  exit

Errors are answered ("error ..."), never a hang.
"""
import asyncio
import sys

import nats
from nats.js.errors import KeyWrongLastSequenceError


async def main():
    server, bucket = sys.argv[1], sys.argv[2]
    nc = await nats.connect(server, connect_timeout=5, max_reconnect_attempts=1)
    kv = await nc.jetstream().key_value(bucket)
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        words = line.split()
        if not words or words[0] == "exit":
            break
        cmd, key = words[0], words[1]
        try:
            if cmd == "create":
                try:
                    revision = await kv.create(key, b"nats-py-peer")
                    print(f"ok {revision}", flush=True)
                except KeyWrongLastSequenceError:
                    print("exists", flush=True)
            elif cmd == "delete":
                await kv.delete(key)
                print("deleted", flush=True)
            else:
                print(f"error unknown command {cmd}", flush=True)
        except Exception as e:  # answered, never a hang
            print(f"error {type(e).__name__}: {e}", flush=True)
    await nc.close()


asyncio.run(main())
