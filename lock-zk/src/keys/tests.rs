use super::*;

/// The hand-written sequence and the search-free parse agree with
/// `format!` and with a plain search.
#[test]
fn sequences_are_written_and_read_as_the_server_names_them() {
    for seq in [0, 7, 42, 9_999_999, 2_147_483_647, 2_147_483_648, u32::MAX] {
        let mut path = String::from("/d/x-");
        push_sequence(&mut path, seq);
        let expected = if i32::try_from(seq).is_ok() {
            format!("/d/x-{seq:010}")
        } else {
            format!("/d/x-{seq:019}")
        };
        assert_eq!(path, expected);
    }
    for (node, name, seq) in [
        ("_c_abc-lock-0000000042", LOCK_NAME, Some(42)),
        ("lock-lock-0000000001", LOCK_NAME, Some(1)),
        ("lock-", LOCK_NAME, None),
        ("lock-12x3", LOCK_NAME, None),
        ("lease-0000000003", LOCK_NAME, None),
        ("abc__lock__0000000009", KAZOO_LOCK_NAME, Some(9)),
        ("n1-0000000005", "n1-", Some(5)),
        ("x-007", "x-0", Some(7)),
    ] {
        assert_eq!(sequence_named(node, name), seq, "{node} / {name}");
    }
}

fn key(s: &str) -> LockKey {
    LockKey::new(s).unwrap()
}

/// Root children map back to their keys, canonical escapes only.
#[test]
fn components_unescape_to_their_keys() {
    for k in ["jobs/nightly", "a b%c", "..", "ключ", "__distlock/cutover"] {
        let name = key_dir_of("", k);
        let name = name.strip_prefix('/').unwrap();
        assert_eq!(key_of_component(name), Some(key(k)), "{name}");
    }
    for not_a_key in [
        ".rwlock",
        ".rwepoch",
        ".semaphore",
        "%41",
        "%zz",
        "a%2f",
        "%FF",
    ] {
        assert_eq!(key_of_component(not_a_key), None, "{not_a_key}");
    }
}

/// Our node data carries the owner and the details; other clients'
/// data has no details.
#[test]
fn node_data_carries_the_details() {
    let owner = OwnerId::random();
    let data = mutex_node_data(owner);
    let (hex, _) = data.split_once('\n').unwrap();
    assert_eq!(hex, owner.to_hex());
    let details = details_of_data(data.as_bytes()).expect("details");
    assert_eq!(details.pid, std::process::id());
    for foreign in ["", "kazoo-k1", "10.0.0.1", "kazoo-k1\nh=x;p=1;n=y;t=2"] {
        assert_eq!(details_of_data(foreign.as_bytes()), None, "{foreign:?}");
    }
}

#[test]
fn keys_cannot_escape_or_collide() {
    let root = "/distlock";
    let cases = [
        "/",
        ".",
        "..",
        "zookeeper",
        "a/b",
        "a%2Fb",
        "../x",
        "a b",
        "ünï",
        "%",
        "-_",
        "A",
        "a",
    ];
    let mut seen = std::collections::HashSet::new();
    for name in cases {
        let dir = key_dir(root, &key(name));
        let component = dir.strip_prefix("/distlock/").unwrap();
        assert!(!component.is_empty());
        assert!(!component.contains('/'), "{dir}");
        assert!(component != "." && component != "..", "{dir}");
        assert!(
            component
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"%_-".contains(&b)),
            "{dir}"
        );
        assert!(seen.insert(dir.clone()), "collision for {name:?}: {dir}");
    }
    assert_eq!(key_dir(root, &key("a/b")), "/distlock/a%2Fb");
    assert_eq!(key_dir(root, &key("a%2Fb")), "/distlock/a%252Fb");
    assert_eq!(key_dir(root, &key("..")), "/distlock/%2E%2E");
    for name in cases {
        let k = key(name);
        let dir = key_dir(root, &k);
        assert!(is_key_dir(root, &k, &dir), "{dir}");
        assert!(!is_key_dir(root, &k, &format!("{dir}x")), "{dir}");
        assert!(!is_key_dir(root, &k, &dir[..dir.len() - 1]), "{dir}");
        assert!(!is_key_dir("/other", &k, &dir), "{dir}");
        assert!(!is_key_dir(root, &key("b"), &dir), "{dir}");
    }
    assert!(!is_key_dir(root, &key("a"), "/distlocka"));
}

#[test]
fn node_names_round_trip() {
    let owner = OwnerId::random();
    let name = format!("{}0000000042", node_prefix(owner));
    assert_eq!(owner_of(&name), Some(owner));
    assert_eq!(sequence_of(&name), Some(42));
    assert_eq!(name.len(), 3 + 36 + 1 + 5 + 10);
    // Curator's own nodes sort with ours; foreign children are ignored.
    let sorted = sorted_lock_nodes(vec![
        name.clone(),
        "_c_5f1e6c8e-0000-0000-0000-000000000000-lock-0000000007".to_owned(),
        "leases".to_owned(),
        "x-lock-".to_owned(),
        "x-lock-12a".to_owned(),
    ]);
    assert_eq!(sorted.len(), 2);
    assert_eq!(sorted[0].0, 7);
    assert_eq!(sorted[1].1, name);
    assert_eq!(owner_of("lock-0000000001"), None);
    assert_eq!(owner_of("_c_zz-lock-1"), None);
    assert_eq!(split_node("/a/b"), Some(("/a", "b")));
    // The one-allocation forms equal the plain ones.
    for owner in [
        OwnerId::random(),
        OwnerId::from_u128(0),
        OwnerId::from_u128(u128::MAX),
    ] {
        let plain = format!("_c_{}-lock-", owner.to_uuid());
        assert_eq!(node_prefix(owner), plain);
        assert_eq!(node_path_prefix("/d/k", owner), format!("/d/k/{plain}"));
        assert_eq!(owner_of(&format!("{plain}0000000001")), Some(owner));
    }
    assert_eq!(
        owner_of("_c_0123456-89abc-def0-0123-456789abcdef-lock-1"),
        OwnerId::from_hex("012345689abcdef00123456789abcdef").ok()
    );
    assert_eq!(
        owner_of("_c_01234567-89ab-cdef-0123-456789abcdef-lockx1"),
        None
    );
    assert_eq!(
        owner_of("_c_01234567-89ab-cdef-0123-456789abcdefX-lock-1"),
        None
    );
    assert_eq!(
        owner_of("_c_0123456789abcdef0123456789abcdef-----lock-1"),
        OwnerId::from_hex("0123456789abcdef0123456789abcdef").ok()
    );
    assert_eq!(
        owner_of("_c_01234567-89ab-cdef-0123-456789abcde--lock-1"),
        None
    );
    assert_eq!(split_node("b"), None);
}

fn owner_probe() -> OwnerId {
    OwnerId::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef)
}

#[test]
fn shapes_have_their_own_directories() {
    let root = "/distlock";
    let k = key("a/b");
    assert_eq!(rw_dir(root, &k), "/distlock/.rwlock/a%2Fb");
    assert_eq!(rw_epoch_path(root, &k), "/distlock/.rwepoch/a%2Fb");
    assert_eq!(sem_dir(root, &k), "/distlock/.semaphore/a%2Fb");
    assert_eq!(latch_dir(root, &k), "/distlock/.election/a%2Fb");
    assert_ne!(key_dir(root, &key(".election")), "/distlock/.election");
    let latch = named_node_path("/d", owner_probe(), LATCH_NAME, 3);
    let latch_name = latch.strip_prefix("/d/").unwrap();
    assert_eq!(owner_of(latch_name), Some(owner_probe()));
    assert_eq!(sequence_of(latch_name), None);
    assert_eq!(
        sorted_named(
            vec![
                latch_name.to_owned(),
                "_c_5f1e6c8e-0000-0000-0000-000000000000-latch-0000000001".to_owned(),
                "_c_5f1e6c8e-0000-0000-0000-000000000000-lock-0000000000".to_owned(),
            ],
            LATCH_NAME
        )
        .iter()
        .map(|(seq, _)| *seq)
        .collect::<Vec<_>>(),
        [1, 3]
    );
    // No key's mutex directory is a shape's parent.
    assert_ne!(key_dir(root, &key(".rwlock")), "/distlock/.rwlock");
    assert!(is_rw_dir(root, &rw_dir(root, &k)));
    assert!(!is_rw_dir(root, "/distlock/.rwlock"));
    assert!(!is_rw_dir(root, &key_dir(root, &k)));
    assert!(!is_rw_dir(root, &format!("{}/x", sem_dir(root, &k))));
    let owner = OwnerId::random();
    let path = named_node_path("/d", owner, READ_NAME, 7);
    let name = path.strip_prefix("/d/").unwrap();
    assert_eq!(owner_of(name), Some(owner));
    assert_eq!(sequence_named(name, READ_NAME), Some(7));
    assert_eq!(sequence_named(name, WRITE_NAME), None);
    assert_eq!(sequence_of(name), None);
    assert_eq!(
        named_prefix("/d", owner, LEASE_NAME),
        format!("/d/_c_{}-lease-", owner.to_uuid())
    );
}

#[test]
fn path_layout_uses_the_key_as_the_directory() {
    let k = key("/app/locks/orders.42");
    assert!(check_path_key(&k).is_ok());
    assert_eq!(
        mutex_dir_of("/distlock", ZkLayout::Path, k.as_str()),
        "/app/locks/orders.42"
    );
    assert_eq!(
        mutex_dir_of("/distlock", ZkLayout::Escaped, k.as_str()),
        "/distlock/%2Fapp%2Flocks%2Forders%2E42"
    );
    assert!(is_mutex_dir(
        "/distlock",
        ZkLayout::Path,
        &k,
        "/app/locks/orders.42"
    ));
    assert!(!is_mutex_dir("/distlock", ZkLayout::Path, &k, "/app/locks"));
    // The library's own keys stay under the root in the path layout.
    let marker = LockKey::new(format!("{}m", lock_core::CUTOVER_KEY_PREFIX)).unwrap();
    let dir = mutex_dir_of("/distlock", ZkLayout::Path, marker.as_str());
    assert_eq!(dir, key_dir_of("/distlock", marker.as_str()));
    assert!(is_mutex_dir("/distlock", ZkLayout::Path, &marker, &dir));
    assert!(!is_mutex_dir(
        "/distlock",
        ZkLayout::Escaped,
        &k,
        "/app/locks/orders.42"
    ));
    for bad in [
        "orders",
        "/",
        "/a/",
        "/a//b",
        "/a/./b",
        "/a/../b",
        "/zookeeper",
        "/zookeeper/x",
        "/a/\u{e000}",
    ] {
        assert!(check_path_key(&key(bad)).is_err(), "{bad}");
    }
    assert!(check_path_key(&key("/zookeeperx")).is_ok());
}

#[test]
fn kazoo_nodes_are_mutex_contenders() {
    let ours = node_path("/d", owner_probe(), 5);
    let ours = ours.strip_prefix("/d/").unwrap().to_owned();
    let children = vec![
        ours.clone(),
        "0f3a9c2b8e7d4c1a9b2e3f4a5b6c7d8e__lock__0000000007".to_owned(),
        "aa3a9c2b8e7d4c1a9b2e3f4a5b6c7d8e__rlock__0000000003".to_owned(),
        "_c_5f1e6c8e-0000-0000-0000-000000000000-lock-0000000001".to_owned(),
        "ffffffffffffffffffffffffffffffff__lock__".to_owned(),
        "leases".to_owned(),
        "x__lock__12a".to_owned(),
    ];
    let sorted: Vec<i64> = sorted_mutex_contenders(children.clone())
        .iter()
        .map(|(seq, _)| *seq)
        .collect();
    assert_eq!(sorted, [1, 3, 5, 7]);
    // Curator's order alone (what an election or a plain sort uses)
    // still ignores kazoo's nodes.
    assert_eq!(sorted_lock_nodes(children).len(), 2);
    assert_eq!(
        owner_of("0f3a9c2b8e7d4c1a9b2e3f4a5b6c7d8e__lock__0000000007"),
        None
    );
}

#[test]
fn kazoo_named_nodes_are_kazoos_names() {
    let owner = owner_probe();
    let path = mutex_node_path("/d", owner, ZkNodeNames::Kazoo, 5);
    assert_eq!(
        path,
        "/d/0123456789abcdef0123456789abcdef__lock__0000000005"
    );
    let name = path.strip_prefix("/d/").unwrap();
    // kazoo's `Lock.prefix` is `uuid4().hex + "__lock__"` (32 lowercase
    // hex digits) and its contender pattern `__lock__(-?\d{10})$`.
    let (hex, seq) = name.split_once(KAZOO_LOCK_NAME).unwrap();
    assert_eq!(hex.len(), 32);
    assert!(hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')));
    assert_eq!(seq.len(), 10);
    assert_eq!(kazoo_owner_of(name), Some(owner));
    assert_eq!(mutex_owner_of(name), Some(owner));
    assert_eq!(owner_of(name), None);
    assert_eq!(mutex_sequence_of(name), Some(5));
    assert_eq!(sequence_of(name), None);
    assert_eq!(
        mutex_node_prefix("/d", owner, ZkNodeNames::Kazoo),
        "/d/0123456789abcdef0123456789abcdef__lock__"
    );
    assert_eq!(
        mutex_node_path("/d", owner, ZkNodeNames::Curator, 5),
        node_path("/d", owner, 5)
    );
    let curator = node_path("/d", owner, 5);
    assert_eq!(
        mutex_owner_of(curator.strip_prefix("/d/").unwrap()),
        Some(owner)
    );
    // Ours among Curator's and kazoo's nodes, by sequence.
    let sorted: Vec<String> = sorted_mutex_contenders(vec![
        name.to_owned(),
        "_c_5f1e6c8e-0000-0000-0000-000000000000-lock-0000000007".to_owned(),
        "aa3a9c2b8e7d4c1a9b2e3f4a5b6c7d8e__lock__0000000002".to_owned(),
    ])
    .into_iter()
    .map(|(_, n)| n)
    .collect();
    assert_eq!(sorted[1], name);
    for bad in [
        "0123456789abcdef0123456789abcdef__lock__",
        "0123456789abcdef0123456789abcdeF__lock__0000000001",
        "0123456789abcdef0123456789abcde__lock__0000000001",
        "0123456789abcdef0123456789abcdefx__lock__0000000001",
        "0123456789abcdef0123456789abcdef__rlock__0000000001",
        "0123456789abcdef0123456789abcdef__lock__-000000001",
        "ünï",
    ] {
        assert_eq!(kazoo_owner_of(bad), None, "{bad}");
    }
    let max = u32::try_from(i32::MAX).unwrap();
    assert!(
        mutex_node_path("/d", owner, ZkNodeNames::Kazoo, max + 1)
            .ends_with(&format!("__lock__{:019}", max + 1))
    );
}

#[test]
fn node_paths_are_the_servers_names() {
    let owner = OwnerId::random();
    let prefix = node_path_prefix("/d/k", owner);
    assert_eq!(node_path("/d/k", owner, 0), format!("{prefix}0000000000"));
    assert_eq!(node_path("/d/k", owner, 42), format!("{prefix}0000000042"));
    let max = u32::try_from(i32::MAX).unwrap();
    assert_eq!(node_path("/d/k", owner, max), format!("{prefix}{max}"));
    assert_eq!(
        node_path("/d/k", owner, max + 1),
        format!("{prefix}{:019}", max + 1)
    );
    let path = node_path("/d/k", owner, 7);
    let (dir, name) = split_node(&path).unwrap();
    assert_eq!(dir, "/d/k");
    assert_eq!(owner_of(name), Some(owner));
    assert_eq!(sequence_of(name), Some(7));
}

/// A detailed latch name keeps the owner, the sequence and Curator's
/// order (the digits after the last `latch-`), and gives the details
/// back; plain names have none.
#[test]
fn latch_names_carry_the_details() {
    let owner = OwnerId::random();
    let details = details_component();
    assert!(is_details_component(&details));
    let path = named_node_path("/e", owner, &latch_name(&details), 7);
    let name = path.strip_prefix("/e/").unwrap();
    assert!(!name.contains('/'));
    assert_eq!(owner_of(name), Some(owner));
    assert_eq!(sequence_named(name, LATCH_NAME), Some(7));
    assert_eq!(details_of_name(name), details);
    let found = holder_details(name).expect("details");
    assert_eq!(found.pid, std::process::id());
    let curator = "_c_5f1e6c8e-0000-0000-0000-000000000000-latch-0000000003";
    assert_eq!(holder_details(curator), None);
    assert_eq!(details_of_name(curator), "");
    let plain = named_node_path("/e", owner, LATCH_NAME, 9);
    assert_eq!(holder_details(plain.strip_prefix("/e/").unwrap()), None);
    let order: Vec<i64> = sorted_named(
        vec![name.to_owned(), curator.to_owned(), "x".to_owned()],
        LATCH_NAME,
    )
    .into_iter()
    .map(|(seq, _)| seq)
    .collect();
    assert_eq!(order, [3, 7]);
    // Curator's `fixForSorting`: the text after the last `latch-`.
    let after = |n: &str| n[n.rfind(LATCH_NAME).unwrap() + LATCH_NAME.len()..].to_owned();
    assert_eq!(after(name), "0000000007");
    for bad in ["h%3Dx-latch-", "h%3Dx-latch-1a", "h;x-latch-1", "-latch-1"] {
        assert_eq!(details_part(bad), None, "{bad}");
    }
}
