import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.Collection;
import java.util.Map;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.leader.Participant;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.retry.RetryOneTime;

/** Commands on stdin, one per line: "<id> read|write <path> <wait ms>",
 *  "<id> sem <path> <wait ms> <limit> <count>", "<id> release", "exit".
 *  Answers on stdout: "<id> ok", "<id> busy", "<id> released", "<id> error ...".
 *  Leader latches: "<id> latch <path> <participant id>" (answers "<id> started"),
 *  then "<id> await <ms>" ("<id> leader" or "<id> waiting"), "<id> has"
 *  ("<id> has true|false"), "<id> leader" ("<id> leads <isLeader> <id>", the id
 *  may be empty; a backslash and a line break in it are written \\ and \n),
 *  "<id> close" ("<id> closed"). */
public class CuratorPeer {
    static final Map<String, BlockingQueue<String>> held = new ConcurrentHashMap<>();
    static final Map<String, LeaderLatch> latches = new ConcurrentHashMap<>();

    static synchronized void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    public static void main(String[] args) throws Exception {
        CuratorFramework client = CuratorFrameworkFactory.newClient(
            args[0], Integer.parseInt(args[1]), 10000, new RetryOneTime(100));
        client.start();
        client.blockUntilConnected();
        say("ready");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        String line;
        while ((line = in.readLine()) != null) {
            String[] w = line.trim().split(" ");
            if (w[0].equals("exit")) {
                System.exit(0);
            }
            if (w[1].equals("latch") || latches.containsKey(w[0])) {
                latch(client, w);
            } else if (w[1].equals("release")) {
                BlockingQueue<String> q = held.get(w[0]);
                if (q == null) {
                    say(w[0] + " error not held");
                } else {
                    q.put("release");
                }
            } else {
                start(client, w);
            }
        }
        System.exit(0);
    }

    static void latch(CuratorFramework client, String[] w) {
        String id = w[0];
        Thread t = new Thread(() -> {
            try {
                if (w[1].equals("latch")) {
                    LeaderLatch latch = new LeaderLatch(client, w[2], w.length > 3 ? w[3] : "");
                    latches.put(id, latch);
                    latch.start();
                    say(id + " started");
                    return;
                }
                LeaderLatch latch = latches.get(id);
                switch (w[1]) {
                    case "await":
                        boolean leads = latch.await(Long.parseLong(w[2]), TimeUnit.MILLISECONDS);
                        say(id + (leads ? " leader" : " waiting"));
                        break;
                    case "has":
                        say(id + " has " + latch.hasLeadership());
                        break;
                    case "leader":
                        Participant p = latch.getLeader();
                        // Escaped: an id with a line break must not pass
                        // for its first line.
                        say(id + " leads " + p.isLeader() + " "
                                + p.getId().replace("\\", "\\\\").replace("\n", "\\n"));
                        break;
                    case "close":
                        latch.close();
                        say(id + " closed");
                        break;
                    default:
                        say(id + " error unknown latch command " + w[1]);
                }
            } catch (Exception e) {
                say(id + " error " + e);
            }
        });
        t.setDaemon(true);
        t.start();
    }

    static void start(CuratorFramework client, String[] w) {
        String id = w[0];
        BlockingQueue<String> q = new LinkedBlockingQueue<>();
        held.put(id, q);
        Thread t = new Thread(() -> {
            try {
                long wait = Long.parseLong(w[3]);
                if (w[1].equals("sem")) {
                    InterProcessSemaphoreV2 sem =
                        new InterProcessSemaphoreV2(client, w[2], Integer.parseInt(w[4]));
                    Collection<Lease> leases =
                        sem.acquire(Integer.parseInt(w[5]), wait, TimeUnit.MILLISECONDS);
                    if (leases == null) {
                        say(id + " busy");
                        return;
                    }
                    say(id + " ok");
                    q.take();
                    sem.returnAll(leases);
                } else {
                    // "mutex", or "read" / "write" of a read-write lock.
                    InterProcessMutex m;
                    if (w[1].equals("mutex")) {
                        m = new InterProcessMutex(client, w[2]);
                    } else {
                        InterProcessReadWriteLock rw = new InterProcessReadWriteLock(client, w[2]);
                        m = w[1].equals("read") ? rw.readLock() : rw.writeLock();
                    }
                    if (!m.acquire(wait, TimeUnit.MILLISECONDS)) {
                        say(id + " busy");
                        return;
                    }
                    say(id + " ok");
                    q.take();
                    m.release();
                }
                say(id + " released");
            } catch (Exception e) {
                say(id + " error " + e);
            }
        });
        t.setDaemon(true);
        t.start();
    }
}
