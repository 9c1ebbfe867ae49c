"""The kazoo peer of lock-zk/tests/kazoo.rs: kazoo's Lock as a process.

argv: <host:port> <session timeout ms>. Prints "ready" once connected, then
reads commands on stdin, one a line, and answers "<id> <answer>":

  <id> lock <path> <wait ms> [<extra pattern>...]   -> ok | busy | error ...
      Lock(client, path, "kazoo-<id>", extra_lock_patterns=[...]);
      wait 0 is a single try (blocking=False)
  <id> rlock <path> <wait ms> [<extra pattern>...]  -> the same with ReadLock
  <id> release                                      -> released
  <id> children <path>                              -> the children, space separated
  <id> contenders <path>                            -> Lock(client, path).contenders(),
      as a JSON list (kazoo reads each contender node's data as its identifier)
  exit
"""
import json
import sys
import threading

from kazoo.client import KazooClient
from kazoo.exceptions import LockTimeout

out_lock = threading.Lock()


def say(line):
    with out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def main():
    hosts, session_ms = sys.argv[1], int(sys.argv[2])
    client = KazooClient(hosts=hosts, timeout=session_ms / 1000.0)
    client.start(timeout=30)
    say("ready")
    held = {}

    def hold(kind, rid, path, wait_ms, extra):
        lock = kind(path, "kazoo-" + rid, extra_lock_patterns=extra)
        try:
            if wait_ms == 0:
                got = lock.acquire(blocking=False)
            else:
                got = lock.acquire(blocking=True, timeout=wait_ms / 1000.0)
        except LockTimeout:
            got = False
        except Exception as e:  # answered, never a hang
            say("%s error %r" % (rid, e))
            return
        if not got:
            say(rid + " busy")
            return
        event = threading.Event()
        held[rid] = event
        say(rid + " ok")
        event.wait()
        lock.release()
        say(rid + " released")

    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        if words[0] == "exit":
            break
        rid, command = words[0], words[1]
        if command in ("lock", "rlock"):
            kind = client.Lock if command == "lock" else client.ReadLock
            args = (kind, rid, words[2], int(words[3]), tuple(words[4:]))
            threading.Thread(target=hold, args=args, daemon=True).start()
        elif command == "release":
            event = held.pop(rid, None)
            if event is None:
                say(rid + " error not held")
            else:
                event.set()
        elif command == "children":
            try:
                say(rid + " " + " ".join(sorted(client.get_children(words[2]))))
            except Exception as e:
                say("%s error %r" % (rid, e))
        elif command == "contenders":
            try:
                say(rid + " " + json.dumps(client.Lock(words[2]).contenders()))
            except Exception as e:
                say("%s error %r" % (rid, e))
        else:
            say(rid + " error unknown command")
    client.stop()


if __name__ == "__main__":
    main()
