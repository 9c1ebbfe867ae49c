//! The kernel-level partition itself: hosts on the lab's bridge reach each
//! other, an isolated host reaches no one and no one reaches it, the
//! others still reach each other, and heal undoes it.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use lock_testkit::OrSkip;
use lock_testkit::netns::Lab;

/// A listener on `port` of host `on`, echoing one byte per connection.
fn listen(lab: &Lab, on: &str, port: u16) {
    let addr = lab.host(on).addr();
    let (tx, rx) = std::sync::mpsc::channel();
    let _detached = lab.host(on).netns().spawn(move || {
        let listener = TcpListener::bind((addr, port)).expect("bind in the namespace");
        tx.send(()).unwrap();
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut byte = [0u8; 1];
            if stream.read_exact(&mut byte).is_ok() {
                let _ = stream.write_all(&byte);
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(5))
        .expect("listener up");
}

/// Whether host `from` gets its byte echoed by `to`'s listener on `port`
/// within 1 s.
fn echoes(lab: &Lab, from: &str, to: &str, port: u16) -> bool {
    let addr = lab.host(to).addr();
    lab.host(from)
        .netns()
        .spawn(move || {
            let Ok(mut stream) =
                TcpStream::connect_timeout(&(addr, port).into(), Duration::from_secs(1))
            else {
                return false;
            };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
            let mut byte = [7u8; 1];
            stream.write_all(&byte).is_ok() && stream.read_exact(&mut byte).is_ok() && byte == [7]
        })
        .join()
        .is_ok_and(|r| r.unwrap_or(false))
}

#[test]
fn isolate_cuts_one_host_off_both_ways_and_heal_restores_it() {
    let Some(lab) = Lab::new(&["a", "b", "c"]).or_skip() else {
        return;
    };
    for host in ["a", "b", "c"] {
        listen(&lab, host, 7000);
    }
    assert!(
        echoes(&lab, "b", "a", 7000),
        "b cannot reach a on the bridge"
    );
    assert!(
        echoes(&lab, "c", "b", 7000),
        "c cannot reach b on the bridge"
    );
    lab.isolate("b").unwrap();
    assert!(
        !echoes(&lab, "b", "a", 7000),
        "the isolated host still reaches a"
    );
    assert!(
        !echoes(&lab, "a", "b", 7000),
        "a still reaches the isolated host"
    );
    assert!(
        echoes(&lab, "c", "a", 7000),
        "isolating b cut c off from a too"
    );
    lab.heal().unwrap();
    assert!(echoes(&lab, "b", "a", 7000), "heal did not restore b");
}
