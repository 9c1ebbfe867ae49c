"""The redis-py peer of lock-redis/tests/legacy.rs: redis-py's own `Lock`
(`Redis.lock`) as a process.

argv: <host> <port> <ttl ms>. Prints "ready" once connected, then reads
commands on stdin, one a line, and answers each with one line:

  try <key>             -> ok <value> | busy      lock.acquire(blocking=False)
  wait <key> <ms>       -> ok <value> | busy      lock.acquire(blocking_timeout=ms)
  extend <key>          -> ok | failed            lock.reacquire() (TTL again)
  release <key>         -> released | not-held    lock.release()
  exit

<value> is the token redis-py stored at <key> (its uuid hex), so the test
can check what our inspect shows. Errors are answered ("error ..."), never
a hang.
"""
import sys

import redis
from redis.exceptions import LockError


def main():
    host, port, ttl_ms = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    client = redis.Redis(host=host, port=port)
    client.ping()
    print("ready", flush=True)
    held = {}
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        cmd = words[0]
        if cmd == "exit":
            break
        try:
            key = words[1]
            if cmd in ("try", "wait"):
                lock = client.lock(key, timeout=ttl_ms / 1000.0, sleep=0.02)
                if cmd == "try":
                    got = lock.acquire(blocking=False)
                else:
                    got = lock.acquire(blocking=True, blocking_timeout=int(words[2]) / 1000.0)
                if got:
                    held[key] = lock
                    answer = "ok " + lock.local.token.decode()
                else:
                    answer = "busy"
            elif cmd == "extend":
                lock = held.get(key)
                try:
                    answer = "ok" if lock is not None and lock.reacquire() else "failed"
                except LockError:
                    answer = "failed"
            elif cmd == "release":
                lock = held.pop(key, None)
                try:
                    if lock is None:
                        raise LockError("not held here")
                    lock.release()
                    answer = "released"
                except LockError:
                    answer = "not-held"
            else:
                answer = "error unknown command " + cmd
        except Exception as e:  # answered, never a hang
            answer = "error %r" % (e,)
        print(answer, flush=True)


main()
