//! A headless Chromium driven over WebDriver (W3C), for tests of pages: Debian's `chromium`
//! and `chromium-driver` (`.ci/setup` installs them). Only the few commands the tests use.
#![allow(dead_code, reason = "not every test binary uses every command")]

use base64::Engine as _;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::request;

/// Sends `request` and reads one answer by its `Content-Length` (chromedriver keeps the
/// connection open whatever `Connection: close` says).
async fn exchange_sized(addr: SocketAddr, request: &[u8]) -> std::io::Result<(u16, Vec<u8>)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream.write_all(request).await?;
    let mut raw = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    let read = async {
        loop {
            if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
                let length: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                if raw.len() >= end + 4 + length {
                    let status = head
                        .split(' ')
                        .nth(1)
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0);
                    return Ok((status, raw[end + 4..end + 4 + length].to_vec()));
                }
            }
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            raw.extend_from_slice(&chunk[..n]);
        }
    };
    tokio::time::timeout(PAGE_DEADLINE * 2, read)
        .await
        .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
}

/// The key of an element reference in WebDriver's answers.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// How long [`Browser::wait_for`] waits.
pub const PAGE_DEADLINE: Duration = Duration::from_secs(30);

/// A browser session, and the driver that runs it.
pub struct Browser {
    driver: std::sync::Mutex<Child>,
    addr: SocketAddr,
    session: String,
    profile: tempfile::TempDir,
}

/// Where Debian puts them; `PAYHOOK_CHROMIUM` and `PAYHOOK_CHROMEDRIVER` name others.
fn installed() -> Result<(String, String), String> {
    let find = |var: &str, default: &str| {
        let path = std::env::var(var).unwrap_or_else(|_| default.to_owned());
        std::path::Path::new(&path)
            .is_file()
            .then_some(path)
            .ok_or_else(|| format!("{default} is not installed (set {var}, or run .ci/setup)"))
    };
    Ok((
        find("PAYHOOK_CHROMIUM", "/usr/bin/chromium")?,
        find("PAYHOOK_CHROMEDRIVER", "/usr/bin/chromedriver")?,
    ))
}

impl Browser {
    /// Starts the driver and a headless session; `Err` says why there is no browser here.
    pub async fn start() -> Result<Self, String> {
        let (chromium, chromedriver) = installed()?;
        let profile = tempfile::tempdir().unwrap();
        let log = profile.path().join("chromedriver.log");
        let (driver, port) =
            Self::spawn_driver_again_if_its_port_is_taken(&chromedriver, &log).await?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut browser = Self {
            driver: std::sync::Mutex::new(driver),
            addr,
            session: String::new(),
            profile,
        };
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=1400,1000",
                    format!("--user-data-dir={}", browser.profile.path().display()),
                ],
            },
        }}});
        let created = browser
            .command("POST", "/session", Some(capabilities))
            .await;
        browser.session = created["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {created}"))
            .to_owned();
        Ok(browser)
    }

    /// [`Self::spawn_driver`], again while the driver says the port it chose is taken: given
    /// `--port=0`, chromedriver (156) picks a port and binds it after, and another driver or
    /// server of the same test binary may bind it in between ("IPv4 port not available.
    /// Exiting..."). `Err` when it cannot be run; panics when it ran and did not start
    /// otherwise, or five times in a row.
    async fn spawn_driver_again_if_its_port_is_taken(
        chromedriver: &str,
        log: &std::path::Path,
    ) -> Result<(Child, u16), String> {
        let mut why = String::new();
        for _ in 0..5 {
            match Self::spawn_driver(chromedriver, log).await? {
                Ok(started) => return Ok(started),
                Err(stopped) if stopped.contains("port not available") => why = stopped,
                Err(stopped) => panic!("{stopped}"),
            }
        }
        panic!("{why} (five times)")
    }

    /// Starts chromedriver on a port of its own choosing (`--port=0`) and reads the port
    /// from what it prints once it listens. Choosing a free port here and handing it over
    /// would leave a window in which another server of the same test binary takes it, and
    /// the commands meant for the driver would reach that server.
    /// Its log goes to `log`, which a failed command quotes. `Err` when it cannot be run;
    /// `Ok(Err)` says why it ran and did not start.
    async fn spawn_driver(
        chromedriver: &str,
        log: &std::path::Path,
    ) -> Result<Result<(Child, u16), String>, String> {
        let mut driver = Command::new(chromedriver)
            .arg("--port=0")
            .arg("--log-level=INFO")
            .arg(format!("--log-path={}", log.display()))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start chromedriver: {e}"))?;
        let stdout = driver.stdout.take().expect("piped");
        let (tell, told) = tokio::sync::oneshot::channel();
        // Reads to the end, so the driver never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut tell = Some(tell);
            let mut seen = String::new();
            for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)) {
                let Ok(line) = line else { break };
                if tell.is_none() {
                    continue;
                }
                let port = line
                    .split_once("started successfully on port ")
                    .and_then(|(_, rest)| rest.trim_end_matches('.').trim().parse::<u16>().ok());
                match port {
                    Some(port) => drop(tell.take().map(|t| t.send(Ok(port)))),
                    None => seen.push_str(&format!("{line}\n")),
                }
            }
            if let Some(tell) = tell {
                let _ = tell.send(Err(seen));
            }
        });
        let why = match tokio::time::timeout(PAGE_DEADLINE, told).await {
            Ok(Ok(Ok(port))) => return Ok(Ok((driver, port))),
            Ok(Ok(Err(printed))) => format!("it stopped after printing:\n{printed}"),
            Ok(Err(_)) => "its output could not be read".to_owned(),
            Err(_) => format!("it did not listen within {PAGE_DEADLINE:?}"),
        };
        let _ = driver.kill();
        let status = driver.wait();
        Ok(Err(format!(
            "chromedriver did not start ({status:?}): {why}"
        )))
    }

    /// One WebDriver command; its `value`.
    async fn command(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let (status, value) = self.try_command(method, path, body).await;
        assert_eq!(status, 200, "WebDriver {method} {path}: {value}");
        value
    }

    /// One WebDriver command: its status and `value` (on an error, the error's object).
    async fn try_command(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let body = body.map(|b| b.to_string());
        let headers = [("content-type", "application/json")];
        let (status, answer) = exchange_sized(
            self.addr,
            &request(method, path, &headers, body.as_deref().map(str::as_bytes)),
        )
        .await
        .unwrap_or_else(|e| panic!("WebDriver {method} {path}: {e}; {}", self.driver_state()));
        let value: Value = serde_json::from_slice(&answer).unwrap_or_else(|e| {
            panic!(
                "WebDriver answered {e}: {:?}",
                String::from_utf8_lossy(&answer)
            )
        });
        (status, value["value"].clone())
    }

    /// Whether the driver still runs, and the end of its log: what a failed exchange shows.
    fn driver_state(&self) -> String {
        let running = match self.driver.lock().map(|mut d| d.try_wait()) {
            Ok(Ok(None)) => "chromedriver is running".to_owned(),
            Ok(Ok(Some(status))) => format!("chromedriver exited: {status}"),
            Ok(Err(e)) => format!("chromedriver's state is unknown: {e}"),
            Err(_) => "chromedriver's state is unknown".to_owned(),
        };
        let log = std::fs::read_to_string(self.profile.path().join("chromedriver.log"))
            .unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(60)..].join("\n");
        format!("{running}; the end of its log:\n{tail}")
    }

    fn path(&self, rest: &str) -> String {
        format!("/session/{}{rest}", self.session)
    }

    /// Opens `url`.
    pub async fn goto(&self, url: &str) {
        self.command("POST", &self.path("/url"), Some(json!({"url": url})))
            .await;
    }

    /// Goes one step back in the window's history.
    pub async fn back(&self) {
        self.command("POST", &self.path("/back"), Some(json!({})))
            .await;
    }

    /// The address the browser shows now.
    pub async fn url(&self) -> String {
        self.command("GET", &self.path("/url"), None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// The elements `css` selects now.
    pub async fn find_all(&self, css: &str) -> Vec<String> {
        let found = self
            .command(
                "POST",
                &self.path("/elements"),
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        found
            .as_array()
            .map(|list| {
                list.iter()
                    .filter_map(|e| e[ELEMENT].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Waits (at most [`PAGE_DEADLINE`]) until `css` selects an element; the first one. The
    /// page updates itself: nothing here reloads it.
    pub async fn wait_for(&self, css: &str) -> String {
        let started = Instant::now();
        loop {
            if let Some(element) = self.find_all(css).await.into_iter().next() {
                return element;
            }
            assert!(
                started.elapsed() < PAGE_DEADLINE,
                "the page showed no `{css}` within {PAGE_DEADLINE:?}; it shows:\n{}",
                self.page_text().await
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits (at most [`PAGE_DEADLINE`]) until `css` selects no element.
    pub async fn wait_for_none(&self, css: &str) {
        let started = Instant::now();
        while !self.find_all(css).await.is_empty() {
            assert!(
                started.elapsed() < PAGE_DEADLINE,
                "the page still showed `{css}` after {PAGE_DEADLINE:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits (at most [`PAGE_DEADLINE`]) until `css` selects an element, and sends the first
    /// one `method` `action` (`text`, `click`, `value`) with `body`; its `value`. The page
    /// re-renders its panels as it updates itself, so an element found may be gone before
    /// the command reaches it, or not shown yet: it is then looked for again (a command on
    /// a stale element did nothing). `what` names the command in a failure.
    async fn on_element(
        &self,
        css: &str,
        method: &str,
        action: &str,
        body: Option<Value>,
        what: &str,
    ) -> (String, Value) {
        let started = Instant::now();
        loop {
            let element = self.wait_for(css).await;
            let path = self.path(&format!("/element/{element}/{action}"));
            let (status, value) = self.try_command(method, &path, body.clone()).await;
            if status == 200 {
                return (element, value);
            }
            // Replaced by the page's refresh meanwhile, or not shown yet (laid out by a
            // render still under way on a busy machine): found again, as a person would.
            let transient = value["error"] == "stale element reference"
                || value["error"] == "element not interactable";
            assert!(
                transient && started.elapsed() < PAGE_DEADLINE,
                "{what} `{css}`: {value}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until `css` selects an element (see [`Self::on_element`]); the first one's text.
    pub async fn wait_for_text(&self, css: &str) -> String {
        let (_, text) = self
            .on_element(css, "GET", "text", None, "reading the text of")
            .await;
        text.as_str().unwrap_or_default().to_owned()
    }

    /// Waits until `css` selects an element (see [`Self::on_element`]), and clicks the first
    /// one.
    pub async fn wait_and_click(&self, css: &str) {
        self.on_element(css, "POST", "click", Some(json!({})), "clicking")
            .await;
    }

    /// Waits until `css` selects an element (see [`Self::on_element`]), and types `text`
    /// into the first one. Returns the element typed into.
    pub async fn wait_and_type(&self, css: &str, text: &str) -> String {
        let body = json!({"text": text});
        let (element, _) = self
            .on_element(css, "POST", "value", Some(body), "typing into")
            .await;
        element
    }

    /// Waits (at most [`PAGE_DEADLINE`]) until the page has rendered `css` again — it
    /// selects an element other than `before` — and returns the new element's `property`.
    pub async fn property_once_rendered_again(
        &self,
        css: &str,
        before: &str,
        property: &str,
    ) -> String {
        let started = Instant::now();
        loop {
            let element = self.wait_for(css).await;
            if element != before {
                let path = self.path(&format!("/element/{element}/property/{property}"));
                let (status, value) = self.try_command("GET", &path, None).await;
                if status == 200 {
                    return value.as_str().unwrap_or_default().to_owned();
                }
                assert!(
                    value["error"] == "stale element reference",
                    "reading `{property}` of `{css}`: {value}"
                );
            }
            assert!(
                started.elapsed() < PAGE_DEADLINE,
                "the page did not render `{css}` again within {PAGE_DEADLINE:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The `property` of the first element `css` selects (waiting for it, as
    /// [`Browser::wait_for`] does).
    pub async fn property(&self, css: &str, property: &str) -> String {
        let element = self.wait_for(css).await;
        let path = self.path(&format!("/element/{element}/property/{property}"));
        self.command("GET", &path, None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// Empties the field `css` selects (waiting for it).
    pub async fn clear(&self, css: &str) {
        let element = self.wait_for(css).await;
        let path = self.path(&format!("/element/{element}/clear"));
        self.command("POST", &path, Some(json!({}))).await;
    }

    pub async fn type_into(&self, element: &str, text: &str) {
        self.command(
            "POST",
            &self.path(&format!("/element/{element}/value")),
            Some(json!({"text": text})),
        )
        .await;
    }

    pub async fn text(&self, element: &str) -> String {
        self.command("GET", &self.path(&format!("/element/{element}/text")), None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// Moves the pointer to the middle of the first element `css` selects now, and leaves it
    /// there.
    /// The page may render the element again before the move reaches it: it is then looked
    /// for again.
    pub async fn hover(&self, css: &str) {
        let started = Instant::now();
        loop {
            let element = self.wait_for(css).await;
            let moved = json!({"type": "pointerMove", "duration": 0, "x": 0, "y": 0,
                               "origin": {ELEMENT: element}});
            let (status, value) = self
                .try_command(
                    "POST",
                    &self.path("/actions"),
                    Some(Self::pointer_actions(moved)),
                )
                .await;
            if status == 200 {
                return;
            }
            assert!(
                value["error"] == "stale element reference" && started.elapsed() < PAGE_DEADLINE,
                "moving the pointer to `{css}`: {value}"
            );
        }
    }

    /// Clicks where the pointer is, whatever is there by now.
    pub async fn click_where_the_pointer_is(&self) {
        self.pointer(json!({"type": "pointerDown", "button": 0}))
            .await;
        self.pointer(json!({"type": "pointerUp", "button": 0}))
            .await;
    }

    /// One action of the mouse (W3C "Perform Actions": the pointer stays where it is put).
    async fn pointer(&self, action: Value) {
        self.command(
            "POST",
            &self.path("/actions"),
            Some(Self::pointer_actions(action)),
        )
        .await;
    }

    fn pointer_actions(action: Value) -> Value {
        json!({"actions": [{"type": "pointer", "id": "mouse",
            "parameters": {"pointerType": "mouse"}, "actions": [action]}]})
    }

    /// Waits for the page's alert, accepts it, and returns its text.
    pub async fn accept_alert(&self) -> String {
        self.answer_dialog(None).await
    }

    /// Waits for the page's prompt, types `answer` into it, accepts it, and returns its
    /// text.
    #[allow(dead_code, reason = "not every browser test answers a prompt")]
    pub async fn answer_prompt(&self, answer: &str) -> String {
        self.answer_dialog(Some(answer)).await
    }

    /// Waits for the page's dialog, types `answer` into it (a prompt), accepts it, and
    /// returns its text.
    async fn answer_dialog(&self, answer: Option<&str>) -> String {
        let started = Instant::now();
        loop {
            let (status, value) = self
                .try_command("GET", &self.path("/alert/text"), None)
                .await;
            if status == 200 {
                if let Some(answer) = answer {
                    self.command(
                        "POST",
                        &self.path("/alert/text"),
                        Some(json!({"text": answer})),
                    )
                    .await;
                }
                self.command("POST", &self.path("/alert/accept"), Some(json!({})))
                    .await;
                return value.as_str().unwrap_or_default().to_owned();
            }
            assert!(
                started.elapsed() < PAGE_DEADLINE,
                "no alert within {PAGE_DEADLINE:?}: {value}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The text of the whole page.
    pub async fn page_text(&self) -> String {
        match self.find_all("body").await.first() {
            Some(body) => self.text(body).await,
            None => String::new(),
        }
    }

    /// A PNG of the window.
    pub async fn screenshot(&self) -> Vec<u8> {
        let encoded = self.command("GET", &self.path("/screenshot"), None).await;
        base64::engine::general_purpose::STANDARD
            .decode(encoded.as_str().unwrap_or_default())
            .unwrap()
    }

    /// Ends the session (the browser exits) and stops the driver.
    pub async fn quit(self) {
        self.command("DELETE", &self.path(""), None).await;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if let Ok(driver) = self.driver.get_mut() {
            let _ = driver.kill();
            let _ = driver.wait();
        }
    }
}
