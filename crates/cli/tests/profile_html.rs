//! `tessera run --profile FILE.html` opened in headless Chromium: the page must run
//! its script without a console message or exception and draw every part (timeline,
//! operation rows, heat-map cells, SRAM rectangles, the fault list of a faulted run),
//! which its own self-check reports as `data-ok="yes"` with an empty errors box.
//! A many-layer run's page groups the timeline by layer, collapsed, and opens the
//! layer its address names. A screenshot of each page is left in the test's
//! temporary directory.
//!
//! Needs `chromium` (Debian: `apt-get install -y chromium`); without it the test
//! fails, unless `TESSERA_SKIP_BROWSER=1` says to skip it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TESSERA_CHROMIUM") {
        return Some(PathBuf::from(p)).filter(|p| p.exists());
    }
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
}

/// Runs chromium headless on `page` (at `#fragment` when not empty) with `args`;
/// returns (stdout, stderr).
fn headless(browser: &Path, page: &Path, fragment: &str, args: &[String]) -> (String, String) {
    // Its own profile directory, so that tests running at once do not share one.
    let profile_dir = page.with_extension("chromium");
    let (out_path, err_path) = (page.with_extension("out"), page.with_extension("err"));
    let mut child = Command::new(browser)
        .args([
            "--headless=new",
            "--disable-gpu",
            "--no-sandbox",
            "--no-first-run",
            "--hide-scrollbars",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile_dir.display()))
        .args(args)
        .arg(format!("file://{}{fragment}", page.display()))
        // Files rather than pipes: a DOM larger than a pipe's buffer would block
        // chromium until someone read it.
        .stdout(std::fs::File::create(&out_path).expect("stdout file"))
        .stderr(std::fs::File::create(&err_path).expect("stderr file"))
        .spawn()
        .expect("start chromium");
    let start = Instant::now();
    while child.try_wait().expect("wait for chromium").is_none() {
        if start.elapsed() > Duration::from_secs(90) {
            let _ = child.kill();
            panic!("chromium did not finish within 90 s on {}", page.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = std::fs::remove_dir_all(&profile_dir);
    let read =
        |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned();
    (read(&out_path), read(&err_path))
}

fn tempdir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "{name}-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&d).expect("temporary directory");
    d
}

/// What [`render`] saw of a page.
struct Rendered {
    /// The DOM after the script ran.
    dom: String,
    /// The run's `--json`.
    json: serde_json::Value,
    /// The page's bytes.
    size: u64,
    /// The DOM of the page opened at `#fragment`, when asked for.
    at_fragment: Option<String>,
}

/// Writes the profile of `tessera run --size tiny --machine small EXTRA`, opens it
/// in Chromium (and again at `#fragment`, when given), and returns what it saw.
fn render(name: &str, extra: &[&str], fragment: Option<&str>) -> Option<Rendered> {
    let Some(browser) = chromium() else {
        if std::env::var("TESSERA_SKIP_BROWSER").is_ok_and(|v| v == "1") {
            eprintln!("SKIPPED: no chromium; TESSERA_SKIP_BROWSER=1 says to skip the browser test");
            return None;
        }
        panic!(
            "chromium is not installed: install it (`apt-get install -y chromium`), point \
             TESSERA_CHROMIUM at a Chromium binary, or set TESSERA_SKIP_BROWSER=1 to skip"
        );
    };
    let dir = tempdir(name);
    let page = dir.join(format!("{name}.html"));
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["run", "--size", "tiny", "--machine", "small", "--json"])
        .args(extra)
        .arg("--profile")
        .arg(&page)
        .output()
        .expect("run tessera");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let size = std::fs::metadata(&page)
        .expect("the profile was written")
        .len();
    let t = Instant::now();
    let dump = |fragment: &str| {
        let (dom, log) = headless(&browser, &page, fragment, &["--dump-dom".to_string()]);
        let consoled: Vec<&str> = log.lines().filter(|l| l.contains(":CONSOLE")).collect();
        assert!(
            consoled.is_empty(),
            "the page wrote to the console (a script error?):\n{}",
            consoled.join("\n")
        );
        dom
    };
    let dom = dump("");
    let load = t.elapsed();
    let at_fragment = fragment.map(|f| dump(&format!("#{f}")));
    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}.png"));
    headless(
        &browser,
        &page,
        "",
        &[
            format!("--screenshot={}", shot.display()),
            "--window-size=1400,2000".to_string(),
        ],
    );
    assert!(shot.exists(), "no screenshot at {}", shot.display());
    eprintln!(
        "{name}: {size} bytes, loaded and dumped in {:.2} s; screenshot {}",
        load.as_secs_f64(),
        shot.display()
    );
    let _ = std::fs::remove_dir_all(&dir);
    Some(Rendered {
        dom,
        json,
        size,
        at_fragment,
    })
}

/// The main timeline's svg (a layer's group draws one of its own).
fn main_timeline(dom: &str) -> &str {
    dom.split(r#"id="timeline-svg""#)
        .nth(1)
        .and_then(|s| s.split("</svg>").next())
        .expect("the timeline's svg")
}

fn check_common(dom: &str, json: &serde_json::Value) {
    let errors = dom
        .split(r#"<pre id="errors">"#)
        .nth(1)
        .and_then(|s| s.split("</pre>").next())
        .expect("the errors box");
    assert!(errors.is_empty(), "the page's self-check failed:\n{errors}");
    assert!(
        dom.contains(r#"data-ok="yes""#),
        "the script did not finish"
    );
    for id in ["summary", "timeline", "ops", "tiles", "sram", "faults"] {
        assert!(dom.contains(&format!(r#"id="{id}""#)), "no section {id}");
    }
    assert!(dom.contains(r#"id="timeline-svg""#), "no timeline");
    // The page opens on the cropped span; its self-check counts the supersteps
    // drawn there, not those of the whole run.
    let supersteps = json["supersteps"].as_u64().unwrap() as usize;
    let drawn = main_timeline(dom).matches(r#"class="ss""#).count();
    assert!(
        (1..=supersteps).contains(&drawn),
        "{drawn} of {supersteps} supersteps"
    );
    assert!(dom.contains("cropped span: "), "no cropped span mark");
    let ops = json["ops"].as_array().unwrap().len();
    assert_eq!(dom.matches(r#"<tr class="op">"#).count(), ops, "op rows");
    // Two heat maps over the small machine's 4 tiles.
    assert_eq!(dom.matches("data-tile=").count(), 2 * 4, "heat-map cells");
    assert!(
        dom.matches(r#"class="buf""#).count() > 20,
        "SRAM rectangles"
    );
    assert!(dom.contains(r#"class="reserved""#), "host descriptors");
    // Exchange code is placed like any code, in its own colour: the legend names
    // it, and a rectangle of the viewer is filled with it (the legend's swatch is a
    // style, not a fill).
    assert!(dom.contains("exchange_code"), "exchange code in the legend");
    assert!(
        dom.contains(r##"fill="#b07aa1""##),
        "exchange code in the SRAM viewer"
    );
}

#[test]
fn the_profile_of_a_run_renders_in_a_browser() {
    let Some(Rendered { dom, json, .. }) = render("profile-ok", &[], None) else {
        return;
    };
    assert_eq!(json["status"], "ok");
    check_common(&dom, &json);
    assert!(dom.contains("encoder interval: "), "no encoder mark");
    assert!(dom.contains("No faults"));
}

#[test]
fn the_profile_of_a_faulted_run_lists_its_faults() {
    let Some(Rendered { dom, json, .. }) =
        render("profile-fault", &["--weaken-rearrange-contract"], None)
    else {
        return;
    };
    assert_eq!(json["status"], "fault");
    check_common(&dom, &json);
    let faults = json["faults"].as_array().unwrap();
    assert!(!faults.is_empty());
    assert_eq!(
        dom.matches(r#"<tr class="fault tile">"#).count(),
        faults.len(),
        "fault rows"
    );
    assert!(
        dom.contains("rearrange_row_major_to_amp_f16"),
        "symbol+offset"
    );
    assert!(dom.contains("ld64step"), "instruction");
    // Faulting tiles are outlined in both heat maps.
    assert!(dom.matches(r##"stroke="#e00""##).count() >= 2);
}

/// The groups of the layers' open and closed tags, in page order: (layer, open,
/// drawn).
fn layer_groups(dom: &str) -> Vec<(u32, bool, bool)> {
    dom.match_indices(r#"<details class="layer-group""#)
        .map(|(i, _)| {
            let tag = &dom[i..i + dom[i..].find('>').expect("a closed tag")];
            let layer = tag
                .split(r#"data-layer=""#)
                .nth(1)
                .and_then(|s| s.split('"').next())
                .and_then(|s| s.parse().ok())
                .expect("data-layer");
            (
                layer,
                tag.contains(" open"),
                tag.contains(r#"data-drawn="yes""#),
            )
        })
        .collect()
}

/// Three layers: one group per layer on the timeline, all closed at first (the
/// page's self-check opened one, checked that it drew its supersteps and
/// operations, and closed it); `#layer-1` opens layer 1 and draws it.
#[test]
fn the_profile_of_three_layers_groups_the_timeline_by_layer() {
    let Some(r) = render("profile-layers", &["--layers", "3"], Some("layer-1")) else {
        return;
    };
    let (dom, json) = (&r.dom, &r.json);
    assert_eq!(json["status"], "ok");
    assert_eq!(json["layers"], 3);
    check_common(dom, json);
    assert!(
        r.size < 30_000_000,
        "the page is {} bytes, over 30 MB",
        r.size
    );
    let groups = layer_groups(dom);
    assert_eq!(
        groups.iter().map(|g| (g.0, g.1)).collect::<Vec<_>>(),
        [(0, false), (1, false), (2, false)],
        "three closed layer groups"
    );
    assert!(groups.iter().any(|g| g.2), "the self-check opened no layer");
    assert_eq!(
        main_timeline(dom).matches(r#"class="layer""#).count(),
        3,
        "layers on the timeline"
    );
    let opened = r.at_fragment.as_deref().expect("the page at #layer-1");
    let groups = layer_groups(opened);
    let open: Vec<u32> = groups.iter().filter(|g| g.1).map(|g| g.0).collect();
    assert_eq!(open, [1], "#layer-1 opens layer 1 alone");
    assert!(groups[1].2, "layer 1 is drawn");
    assert!(opened.contains(r#"id="layer-svg-1""#), "layer 1's timeline");
    let ops = opened.matches(r#"<tr class="layer-op">"#).count();
    let layer1 = json["ops"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["name"].as_str().unwrap().starts_with("layers.1."))
        .count();
    assert!(layer1 > 0);
    // The self-check's layer (0) and layer 1: each lists its own operations.
    assert_eq!(ops, 2 * layer1, "operation rows of the opened layers");
}

/// Same run, same bytes: no timestamps, no hash-map order in the page.
#[test]
fn the_same_run_gives_a_byte_identical_profile() {
    let dir = tempdir("profile-twice");
    let pages: Vec<Vec<u8>> = (0..2)
        .map(|i| {
            let page = dir.join(format!("{i}.html"));
            let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
                .args(["run", "--size", "tiny", "--machine", "small", "--json"])
                .arg("--profile")
                .arg(&page)
                .output()
                .expect("run tessera");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::fs::read(&page).expect("the profile was written")
        })
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(pages[0] == pages[1], "two runs wrote different pages");
}
