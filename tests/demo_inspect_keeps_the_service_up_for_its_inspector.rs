//! `payhook demo --inspect`: after the scenarios the demo's service stays up, its inspector's
//! address (with a token made up for the run) opens the page, the page lists what the
//! scenarios delivered, and Ctrl-C (SIGINT) stops it cleanly.
#![cfg(unix)]
#![allow(clippy::unwrap_used, reason = "tests")]

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::{exchange, request};

#[tokio::test]
async fn the_demo_stays_up_with_its_inspector_until_interrupted() {
    let mut demo = Command::new(env!("CARGO_BIN_EXE_payhook"))
        .args(["demo", "--inspect"])
        .env_clear()
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = demo.stdout.take().unwrap();
    // The lines are read on a thread of their own: the demo prints as it goes.
    let (lines, printed) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let started = Instant::now();
    let mut seen = Vec::new();
    let url = loop {
        let line = printed
            .recv_timeout(Duration::from_secs(120).saturating_sub(started.elapsed()))
            .unwrap_or_else(|_| {
                panic!(
                    "no inspector address printed; the demo said:\n{}",
                    seen.join("\n")
                )
            });
        if let Some(at) = line
            .find("http://")
            .filter(|_| line.contains("/payhook/admin/inspector#token="))
        {
            break line[at..].trim().to_owned();
        }
        seen.push(line);
    };
    assert!(
        seen.iter().any(|l| l.contains("scenarios passed")),
        "the scenarios ran first:\n{}",
        seen.join("\n")
    );
    let rest = url.strip_prefix("http://").unwrap();
    let (addr, path) = rest.split_once('/').unwrap();
    let addr = addr.parse().unwrap();
    // The token is in the fragment, which a browser never sends: the page's form takes it.
    let (path, token) = path.split_once("#token=").unwrap();
    let asked = exchange(addr, &request("GET", &format!("/{path}"), &[], None)).await;
    assert_eq!(asked.status, 401);
    assert!(String::from_utf8_lossy(&asked.body).contains("location.hash"));
    let form = format!("token={token}");
    let login = exchange(
        addr,
        &request(
            "POST",
            &format!("/{path}/login"),
            &[("content-type", "application/x-www-form-urlencoded")],
            Some(form.as_bytes()),
        ),
    )
    .await;
    assert_eq!(
        login.status,
        303,
        "{}",
        String::from_utf8_lossy(&login.body)
    );
    let cookie = login
        .header("set-cookie")
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let page = exchange(
        addr,
        &request(
            "GET",
            "/payhook/admin/inspector",
            &[("cookie", &cookie)],
            None,
        ),
    )
    .await;
    assert_eq!(page.status, 200);
    let html = String::from_utf8_lossy(&page.body);
    assert!(
        html.contains("tr class='delivery booked'"),
        "the scenarios' deliveries are listed"
    );

    // Ctrl-C stops it, and it exits as a passed demo.
    support::signal(demo.id(), "INT");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = demo.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the demo did not stop on SIGINT");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
}
