"""A legacy lock client as a process, for the legacy-fleet rollout
(conformance/src/legacy): another library's lock, driven over stdin.

argv: redis <host> <port>     redis-py's Lock (SET <key> <token> NX PX ttl)
      kazoo <host:port>       kazoo's Lock (<path>/<id>__lock__<seq>)

Prints "ready" once connected, then answers one line per command:

  acquire <key> <ttl ms> <wait ms>   -> ok [<ms>] | busy | error ...
      wait 0 is a single try; <ms>: when the try that got the lock began,
      in ms after the command arrived (redis-py: the lock's TTL runs from
      then); kazoo has no TTL (its session is the lease) and says no <ms>
  release <key>                      -> released | error ...
  exit
"""
import sys
import time
import uuid


def say(line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class RedisPy:
    def __init__(self, host, port):
        import redis

        self.client = redis.Redis(host=host, port=int(port))
        self.client.ping()
        self.held = {}

    def acquire(self, key, ttl_ms, wait_ms):
        # Single tries in a loop (what Lock.acquire(blocking=True) does
        # inside, with a shorter sleep), so the answer can say when the
        # successful SET was sent.
        lock = self.client.lock(key, timeout=ttl_ms / 1000.0)
        start = time.monotonic()
        deadline = start + wait_ms / 1000.0
        while True:
            tried = time.monotonic()
            if lock.acquire(blocking=False):
                self.held[key] = lock
                return "%.3f" % ((tried - start) * 1000.0)
            if tried >= deadline:
                return None
            time.sleep(0.002)

    def release(self, key):
        self.held.pop(key).release()


class Kazoo:
    def __init__(self, hosts):
        from kazoo.client import KazooClient

        self.client = KazooClient(hosts=hosts, timeout=4.0)
        self.client.start(timeout=30)
        self.identifier = "legacy-" + uuid.uuid4().hex[:8]
        self.locks = {}
        self.held = {}

    def acquire(self, key, ttl_ms, wait_ms):
        from kazoo.exceptions import LockTimeout

        lock = self.locks.get(key)
        if lock is None:
            lock = self.locks[key] = self.client.Lock(key, self.identifier)
        try:
            if wait_ms == 0:
                got = lock.acquire(blocking=False)
            else:
                got = lock.acquire(blocking=True, timeout=wait_ms / 1000.0)
        except LockTimeout:
            got = False
        if got:
            self.held[key] = lock
            return ""
        return None

    def release(self, key):
        self.held.pop(key).release()


def main():
    kind = sys.argv[1]
    peer = RedisPy(sys.argv[2], sys.argv[3]) if kind == "redis" else Kazoo(sys.argv[2])
    say("ready")
    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "exit":
            break
        try:
            if words[0] == "acquire":
                got = peer.acquire(words[1], int(words[2]), int(words[3]))
                say("busy" if got is None else ("ok " + got).strip())
            elif words[0] == "release":
                peer.release(words[1])
                say("released")
            else:
                say("error unknown command")
        except Exception as e:  # answered, never a hang
            say("error %r" % (e,))


if __name__ == "__main__":
    main()
