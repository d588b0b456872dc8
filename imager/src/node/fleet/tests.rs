use super::*;
use std::sync::{Condvar, Mutex};

fn members(n: usize) -> Vec<Member> {
    (0..n)
        .map(|i| Member {
            node: format!("10.0.0.{i}"),
            server_name: Some(format!("node{i}")),
        })
        .collect()
}

fn report(m: &Member, outcome: Outcome) -> Report {
    Report {
        node: m.shown(),
        outcome,
        version: None,
        slot: None,
        message: String::new(),
        seconds: 0,
    }
}

fn outcomes(r: &[Report]) -> Vec<Outcome> {
    r.iter().map(|r| r.outcome).collect()
}

/// Runs a rollout whose node operation records when it ran and fails for
/// the nodes in `failing`; the order the nodes ran in, and the reports.
fn run(n: usize, policy: Policy, failing: &[usize]) -> (Vec<usize>, Vec<Report>) {
    let ms = members(n);
    let ran = Mutex::new(Vec::new());
    let op = |m: &Member| {
        let i: usize = m
            .node
            .rsplit('.')
            .next()
            .unwrap_or("0")
            .parse()
            .unwrap_or(0);
        ran.lock().unwrap_or_else(|e| e.into_inner()).push(i);
        report(
            m,
            if failing.contains(&i) {
                Outcome::Failed
            } else {
                Outcome::Done
            },
        )
    };
    let mut seen = 0;
    let reports = rollout(&ms, policy, &op, &mut |_| seen += 1);
    assert_eq!(seen, n, "every node is reported once");
    (ran.into_inner().unwrap_or_else(|e| e.into_inner()), reports)
}

const ONE_BY_ONE: Policy = Policy {
    max_parallel: 1,
    canary: 1,
    continue_on_failure: false,
};

#[test]
fn one_at_a_time_in_the_order_given() {
    let (ran, reports) = run(3, ONE_BY_ONE, &[]);
    assert_eq!(ran, [0, 1, 2]);
    assert_eq!(outcomes(&reports), [Outcome::Done; 3]);
}

#[test]
fn a_failed_canary_leaves_the_others_untouched() {
    let (ran, reports) = run(3, ONE_BY_ONE, &[0]);
    assert_eq!(ran, [0]);
    assert_eq!(
        outcomes(&reports),
        [Outcome::Failed, Outcome::NotStarted, Outcome::NotStarted]
    );
    // Whatever the parallelism after the canary.
    let (ran, _) = run(
        5,
        Policy {
            max_parallel: 4,
            ..ONE_BY_ONE
        },
        &[0],
    );
    assert_eq!(ran, [0]);
}

#[test]
fn a_failure_stops_what_has_not_started() {
    let (ran, reports) = run(4, ONE_BY_ONE, &[1]);
    assert_eq!(ran, [0, 1]);
    assert_eq!(
        outcomes(&reports),
        [
            Outcome::Done,
            Outcome::Failed,
            Outcome::NotStarted,
            Outcome::NotStarted
        ]
    );
    let going_on = Policy {
        continue_on_failure: true,
        ..ONE_BY_ONE
    };
    let (ran, reports) = run(4, going_on, &[1, 2]);
    assert_eq!(ran, [0, 1, 2, 3]);
    assert_eq!(
        outcomes(&reports),
        [
            Outcome::Done,
            Outcome::Failed,
            Outcome::Failed,
            Outcome::Done
        ]
    );
    // Past a failed canary nothing goes on, whatever the policy.
    let (ran, reports) = run(4, going_on, &[0]);
    assert_eq!(ran, [0]);
    assert_eq!(reports[3].outcome, Outcome::NotStarted);
}

#[test]
fn at_most_max_parallel_at_once() {
    let ms = members(6);
    let state = (Mutex::new((0usize, 0usize)), Condvar::new());
    let op = |m: &Member| {
        let (lock, cv) = &state;
        let mut g = lock.lock().unwrap_or_else(|e| e.into_inner());
        g.0 += 1;
        g.1 = g.1.max(g.0);
        cv.notify_all();
        // Wait (bounded) for a second node to run alongside.
        let (mut g, _) = cv
            .wait_timeout_while(g, Duration::from_secs(5), |g| g.0 < 2 && g.1 < 2)
            .unwrap_or_else(|e| e.into_inner());
        g.0 -= 1;
        drop(g);
        report(m, Outcome::Done)
    };
    let reports = rollout(
        &ms,
        Policy {
            max_parallel: 2,
            canary: 0,
            continue_on_failure: false,
        },
        &op,
        &mut |_| {},
    );
    assert_eq!(outcomes(&reports), [Outcome::Done; 6]);
    let (lock, _) = &state;
    assert_eq!(lock.lock().unwrap_or_else(|e| e.into_inner()).1, 2);
}

#[test]
fn members_and_lists() {
    let m = Member::parse("node1@127.0.0.1:50001");
    assert_eq!(
        m.ok(),
        Some(Member {
            node: "127.0.0.1:50001".into(),
            server_name: Some("node1".into())
        })
    );
    assert!(Member::parse("10.0.2.15").is_ok_and(|m| m.server_name.is_none()));
    for bad in ["", "a b", "bad_name@10.0.0.1", "n@", "n@host:port"] {
        assert!(Member::parse(bad).is_err(), "{bad:?}");
    }
    let Ok(dir) = tempfile::tempdir() else {
        panic!("a temporary directory");
    };
    let list = dir.path().join("fleet");
    let write = std::fs::write(
        &list,
        "# rack 1\nnode1@10.0.0.1\n\n  node2@10.0.0.2:50000  \n",
    );
    assert!(write.is_ok());
    let Ok(ms) = read_members(&list) else {
        panic!("a list");
    };
    assert_eq!(ms.len(), 2);
    assert!(check_members(&ms).is_ok());
    assert!(check_members(&[]).is_err());
    assert!(check_members(&[ms[0].clone(), ms[0].clone()]).is_err());
    let same = |a: &str, b: &str| {
        check_members(&[Member::parse(a).unwrap(), Member::parse(b).unwrap()]).is_err()
    };
    assert!(same("10.0.0.1", "n@10.0.0.1:50000"));
    assert!(!same("10.0.0.1", "10.0.0.1:50001"));
    assert!(std::fs::write(&list, "node1@10.0.0.1\nnot a node\n").is_ok());
    let Err(e) = read_members(&list) else {
        panic!("a bad line accepted");
    };
    assert!(format!("{e:#}").contains("line 2"), "{e:#}");
}

/// A rolling upgrade gives each node its pull's deadline and the time to
/// come back; a `--timeout` a pull within its deadline could outlast is
/// refused before any node is asked; other requests keep the plain wait.
#[test]
fn a_rollouts_timeout_covers_the_pull_or_is_refused() {
    let upgrade = |deadline: Option<u32>| Request::Upgrade {
        image: "registry.example/os:1.0.0".into(),
        stage: false,
        preserve: true,
        tries: None,
        version: None,
        allow_downgrade: false,
        deadline,
        stall: None,
        credentials: None,
    };
    let default = u64::from(nodeapi::proto::DEFAULT_PULL_DEADLINE);
    assert_eq!(
        rollout_timeout(None, &upgrade(None)).unwrap(),
        Duration::from_secs(default + WAIT_TIMEOUT)
    );
    assert_eq!(
        rollout_timeout(None, &upgrade(Some(120))).unwrap(),
        Duration::from_secs(120 + WAIT_TIMEOUT)
    );
    assert_eq!(
        rollout_timeout(Some(900), &upgrade(Some(600))).unwrap(),
        Duration::from_secs(900)
    );
    let e = rollout_timeout(Some(600), &upgrade(None))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("--timeout 600 is not longer than the pull's deadline of 1800 s")
            && e.contains("--deadline"),
        "{e}"
    );
    assert!(rollout_timeout(Some(600), &upgrade(Some(600))).is_err());
    let rollback = Request::Rollback {
        allow_downgrade: false,
    };
    assert_eq!(
        rollout_timeout(None, &rollback).unwrap(),
        Duration::from_secs(WAIT_TIMEOUT)
    );
    assert_eq!(
        rollout_timeout(Some(30), &rollback).unwrap(),
        Duration::from_secs(30)
    );
}
