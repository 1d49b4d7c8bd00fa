//! The dashboard drawn into ratatui's TestBackend from state built by hand.

use std::time::{Duration, Instant};

use kvshared::routing::ShardId;
use kvshared::stats::{Counts, Durability, NodeStats, SystemFigures};
use kvtui::app::{App, DashboardConfig, Mode};
use kvtui::state::Sample;
use ratatui::Terminal;
use ratatui::backend::TestBackend;

fn stats(shard: u32, uptime_ms: u64, gets: u64, puts: u64, cpu_ms: u64) -> NodeStats {
    NodeStats {
        shard: ShardId { index: shard, count: 3 },
        pid: 10 + shard,
        uptime_ms,
        keys: 500_000,
        counts: Counts {
            gets,
            puts,
            hits: gets,
            bytes_in: gets * 20,
            bytes_out: gets * 150,
            ..Counts::default()
        },
        system: SystemFigures {
            system_sampled_ms: uptime_ms,
            process_cpu_ms: cpu_ms,
            process_rss_bytes: 210_000_000,
            host_mem_used_bytes: 3_000_000_000,
            host_mem_total_bytes: 24_000_000_000,
            host_cpus: 2,
            ..SystemFigures::default()
        },
        // Node 0 keeps a log; the others are in memory only.
        durability: if shard == 0 {
            Durability {
                mode: "always".into(),
                log_bytes: 12_000_000,
                log_entries: 459,
                log_memory_bytes: 1 << 20,
                last_applied: 120_459,
                snapshot_index: 120_000,
                snapshot_bytes: 142_000_000,
                fsyncs: 4_321,
                fsync: fsync_times(),
                ..Durability::default()
            }
        } else {
            Durability::default()
        },
        ..NodeStats::default()
    }
}

/// Three nodes: two answering with known rates over 2 s, the third refusing connections.
fn app() -> App {
    let nodes = vec![
        "10.0.0.1:7070".to_string(),
        "10.0.0.2:7070".to_string(),
        "10.0.0.3:7070".to_string(),
    ];
    let mut app = App::new(
        &DashboardConfig {
            nodes,
            client: Default::default(),
            interval: Duration::from_millis(500),
            window: Duration::from_secs(60),
            record: None,
            replay: None,
        },
        false,
    );
    let t0 = app.view.started;
    let t1 = t0 + Duration::from_secs(2);
    for (node, gets) in [(0usize, 2_400_000u64), (1, 1_000)] {
        app.view.apply(Sample {
            node,
            at: t0,
            result: Ok(stats(node as u32, 10_000, 0, 0, 0)),
        });
        app.view.apply(Sample {
            node,
            at: t1,
            result: Ok(stats(node as u32, 12_000, gets, gets / 20, 1_800)),
        });
    }
    app.view.apply(Sample {
        node: 2,
        at: t1,
        result: Err("cannot connect to 10.0.0.3:7070: Connection refused".into()),
    });
    app.view.tick(t1);
    app.now = t1;
    app
}

fn screen(app: &App, width: u16, height: u16) -> String {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
    terminal.draw(|f| kvtui::ui::draw(f, app)).unwrap();
    let buf = terminal.backend().buffer().clone();
    let mut out = String::new();
    for y in 0..height {
        for x in 0..width {
            out.push_str(buf[(x, y)].symbol());
        }
        out.push('\n');
    }
    out
}

/// The text of the cell in column `header` of the table row whose first cell is `row`:
/// from where the header starts to where the next header starts (cells are left-aligned).
fn cell(text: &str, row: &str, header: &str) -> String {
    let lines: Vec<Vec<char>> = text.lines().map(|l| l.chars().collect()).collect();
    let header_line = lines
        .iter()
        .find(|l| l.iter().collect::<String>().contains(" OP/S "))
        .expect("a header row");
    let header_text: String = header_line.iter().collect();
    // Column of a header, in characters (the border is a multi-byte character).
    let column = |h: &str| {
        header_text
            .find(&format!(" {h} "))
            .map(|b| header_text[..b].chars().count() + 1)
    };
    let starts: Vec<usize> = kvtui::ui::table::HEADERS
        .iter()
        .filter(|h| !h.is_empty())
        .filter_map(|h| column(h))
        .collect();
    let start = column(header).unwrap_or_else(|| panic!("no column {header}:\n{text}"));
    let end = starts
        .iter()
        .filter(|&&s| s > start)
        .min()
        .copied()
        .unwrap_or(header_line.len());
    let line = lines
        .iter()
        .map(|l| l.iter().collect::<String>())
        .find(|l| l.trim_start().trim_start_matches('│').trim_start().starts_with(row) && !l.contains("is down"))
        .unwrap_or_else(|| panic!("no row {row}:\n{text}"));
    let chars: Vec<char> = line.chars().collect();
    chars[start.min(chars.len())..end.min(chars.len())]
        .iter()
        .collect::<String>()
        .trim()
        .to_string()
}

#[test]
fn the_table_shows_each_node_the_totals_and_the_down_node() {
    let text = screen(&app(), 200, 40);
    // 2.4M gets + 120k puts in 2 s = 1.26M op/s on node 0; 1.05k gets+puts in 2 s on node 1.
    assert_eq!(cell(&text, "10.0.0.1:7070", "OP/S"), "1.3M", "{text}");
    assert_eq!(cell(&text, "10.0.0.2:7070", "OP/S"), "525", "{text}");
    assert_eq!(cell(&text, "10.0.0.1:7070", "CPU%"), "90", "{text}");
    assert_eq!(cell(&text, "10.0.0.1:7070", "RSS"), "210 MB", "{text}");
    assert_eq!(cell(&text, "10.0.0.1:7070", "SHARD"), "0/3", "{text}");
    assert!(cell(&text, "10.0.0.3:7070", "STATE").starts_with("down"), "{text}");
    assert_eq!(cell(&text, "10.0.0.3:7070", "OP/S"), "-", "{text}");
    assert_eq!(cell(&text, "TOTAL", "OP/S"), "1.3M", "{text}");
    assert!(text.contains("2/3 up"), "totals:\n{text}");
    assert!(
        text.contains("10.0.0.3:7070 is down") && text.contains("Connection refused"),
        "{text}"
    );
    assert!(text.contains("op/s") && text.contains("kvd CPU"), "charts:\n{text}");
}

#[test]
fn the_down_row_is_red() {
    let app = app();
    let mut terminal = Terminal::new(TestBackend::new(200, 40)).unwrap();
    terminal.draw(|f| kvtui::ui::draw(f, &app)).unwrap();
    let buf = terminal.backend().buffer();
    let row = (0..40)
        .find(|&y| {
            let line: String = (0..30).map(|x| buf[(x, y)].symbol().to_string()).collect();
            line.contains("10.0.0.3:7070") && !line.contains("is down")
        })
        .expect("the down node has a table row");
    let x = (0..200).find(|&x| buf[(x, row)].symbol() == "1").unwrap();
    assert_eq!(buf[(x, row)].fg, ratatui::style::Color::Red);
}

#[test]
fn the_detail_view_lists_every_counter() {
    let mut app = app();
    app.mode = Mode::Detail;
    let text = screen(&app, 200, 45);
    for needle in [
        "shard 0/3",
        "2,400,000",
        "errors by kind",
        "wrong shard",
        "host interfaces",
        "connections open",
        "durable, fsync always: log 12.0 MB",
        "snapshot at entry 120,000 (142 MB",
        "fsyncs 4,321 (p50 358 us, p99 2.3 ms)",
    ] {
        assert!(text.contains(needle), "{needle} missing:\n{text}");
    }
}

#[test]
fn help_and_pause_are_shown() {
    let mut app = app();
    app.mode = Mode::Help;
    app.paused = true;
    let text = screen(&app, 200, 40);
    assert!(text.contains("PAUSED"));
    assert!(text.contains("select a node") && text.contains("chart window"));
}

#[test]
fn the_headless_text_is_the_same_table() {
    let app = app();
    let text = kvtui::headless::text(&app.view);
    assert!(text.contains("NODE") && text.contains("TOTAL") && text.contains("1.3M"));
    assert!(text.contains("10.0.0.3:7070 is down"));
    let _ = Instant::now();
}

#[test]
fn small_and_tiny_terminals_do_not_break_drawing() {
    let mut app = app();
    for (w, h) in [(80, 24), (40, 10), (10, 3), (1, 1)] {
        for mode in [Mode::Table, Mode::Detail, Mode::Help] {
            app.mode = mode;
            let text = screen(&app, w, h);
            assert_eq!(text.lines().count(), h as usize);
        }
    }
}

#[test]
fn the_benchmark_panel_shows_progress_throughput_and_latency() {
    use kvtui::BenchProgress;
    let mut app = App::new(
        &DashboardConfig {
            nodes: vec!["10.0.0.1:7070".into()],
            client: Default::default(),
            interval: Duration::from_millis(500),
            window: Duration::from_secs(60),
            record: None,
            replay: None,
        },
        true,
    );
    let t0 = app.view.started;
    let bench = app.bench.as_mut().unwrap();
    for (i, ops) in [0u64, 1_000_000, 2_200_000].into_iter().enumerate() {
        let at = t0 + Duration::from_secs(i as u64);
        bench.update(
            BenchProgress {
                title: "workload b, 128 tasks, batch 64".into(),
                elapsed: Duration::from_secs(1 + i as u64),
                warmup: Duration::from_secs(2),
                total: Duration::from_secs(12),
                completed_ops: ops,
                measured_ops: ops.saturating_sub(1_000_000),
                failed_ops: 0,
                recent_latency_us: Some((850.0, 2400.0)),
                done: false,
            },
            at,
            i as f64,
        );
    }
    app.now = t0 + Duration::from_secs(2);
    let text = screen(&app, 200, 45);
    assert!(text.contains("workload b, 128 tasks, batch 64"), "{text}");
    assert!(text.contains("measuring") && text.contains("3s / 12s"), "{text}");
    assert!(text.contains("throughput  1.2M op/s"), "{text}");
    assert!(text.contains("p50   850 us   p99 2400 us"), "{text}");
    assert!(text.contains("warm-up 2s excluded"), "{text}");
    // The count is the measured window's, as in the summary; the warm-up's apart.
    assert!(
        text.contains("measured    1.2M ops   failed 0   (+1.0M in warm-up)"),
        "{text}"
    );
}

/// `n` nodes of a cluster of `n`; the first `up` answer twice (with errors and service times
/// on node 0), the rest were seen once and then stopped answering `down_for` before `now`.
fn cluster(n: usize, up: usize, down_for: Duration) -> App {
    let nodes: Vec<String> = (0..n).map(|i| format!("10.0.0.{}:7070", i + 1)).collect();
    let mut app = App::new(
        &DashboardConfig {
            nodes,
            client: Default::default(),
            interval: Duration::from_millis(500),
            window: Duration::from_secs(60),
            record: None,
            replay: None,
        },
        false,
    );
    let t0 = app.view.started;
    let t1 = t0 + Duration::from_secs(20);
    for node in 0..n {
        let mut first = stats(node as u32, 10_000, 0, 0, 0);
        first.shard.count = n as u32;
        app.view.apply(Sample {
            node,
            at: t0,
            result: Ok(first),
        });
        if node < up {
            let mut later = stats(node as u32, 30_000, 2_000_000, 100_000, 9_000);
            later.shard.count = n as u32;
            if node == 0 {
                later.counts.malformed_op = 40_000;
                later.counts.wrong_shard = 20_000;
                let mut dense = vec![0; kvshared::latency::BUCKETS];
                dense[kvshared::latency::bucket_of(20_000)] = 90;
                dense[kvshared::latency::bucket_of(900_000)] = 10;
                later.latency.get = kvshared::latency::Latency::from_dense(&dense, 0);
                let mut hot = vec![0; kvshared::latency::BUCKETS];
                hot[kvshared::latency::bucket_of(3_000_000)] = 7;
                later.latency.map_shards = vec![Default::default(), kvshared::latency::Latency::from_dense(&hot, 0)];
            }
            app.view.apply(Sample {
                node,
                at: t1,
                result: Ok(later),
            });
        } else {
            app.view.apply(Sample {
                node,
                at: t1 - down_for,
                result: Err("cannot connect: Connection refused".into()),
            });
        }
    }
    app.view.tick(t1);
    app.now = t1;
    app
}

fn row_count(text: &str, addr: &str) -> usize {
    text.lines()
        .filter(|l| l.contains(addr) && !l.contains("is down"))
        .count()
}

/// With most nodes down every node row, the total and the charts' room are still there
/// (the charts give way first, then the down lines).
#[test]
fn every_node_and_the_total_stay_visible_when_nodes_are_down() {
    for (n, up, w, h) in [(5, 1, 160, 45), (3, 1, 250, 70), (8, 2, 160, 24), (5, 1, 80, 24)] {
        let app = cluster(n, up, Duration::from_secs(12));
        let text = screen(&app, w, h);
        for i in 0..n {
            assert!(
                row_count(&text, &format!("10.0.0.{}:7070", i + 1)) >= 1,
                "node {i} at {w}x{h}:\n{text}"
            );
        }
        assert!(text.contains("TOTAL"), "{w}x{h}:\n{text}");
        assert!(text.contains(&format!("{up}/{n} up")), "{w}x{h}:\n{text}");
    }
}

/// On narrow terminals the least important columns go first: node and op/s stay whole.
#[test]
fn narrow_terminals_keep_node_and_ops_readable() {
    let app = cluster(3, 3, Duration::ZERO);
    for (w, h) in [(80, 24), (60, 15)] {
        let text = screen(&app, w, h);
        assert_eq!(cell(&text, "10.0.0.1:7070", "OP/S"), "105k", "{w}x{h}:\n{text}");
        assert_eq!(cell(&text, "TOTAL", "OP/S"), "315k", "{w}x{h}:\n{text}");
        assert!(cell(&text, "10.0.0.1:7070", "STATE") == "up", "{w}x{h}:\n{text}");
    }
    let text = screen(&app, 80, 24);
    assert_eq!(cell(&text, "10.0.0.1:7070", "ERR/S"), "2.0k", "{text}");
    let wide = screen(&app, 250, 45);
    for h in ["NODE", "SHARD", "UPTIME", "HOST MEM", "NIC RX/TX", "TREND", "P99"] {
        assert!(wide.contains(h), "{h} at 250 wide:\n{wide}");
    }
}

/// A down node's last known figures are dimmed, its trend is blank, and its state says
/// how long ago it last answered (20 s: its one good sample), unit included.
#[test]
fn a_down_node_shows_stale_figures_dimmed() {
    let app = cluster(3, 2, Duration::from_secs(12));
    let text = screen(&app, 250, 45);
    assert_eq!(cell(&text, "10.0.0.3:7070", "STATE"), "down 20s", "{text}");
    let trend = cell(&text, "10.0.0.3:7070", "TREND");
    assert!(!trend.contains(['▁', '█']), "a frozen sparkline: {trend}");
    assert_eq!(cell(&text, "10.0.0.3:7070", "KEYS"), "500k", "{text}");
    let mut terminal = Terminal::new(TestBackend::new(250, 45)).unwrap();
    terminal.draw(|f| kvtui::ui::draw(f, &app)).unwrap();
    let buf = terminal.backend().buffer();
    let y = (0..45)
        .find(|&y| {
            let line: String = (0..40).map(|x| buf[(x, y)].symbol().to_string()).collect();
            line.contains("10.0.0.3:7070")
        })
        .unwrap();
    let line: String = (0..250).map(|x| buf[(x, y)].symbol().to_string()).collect();
    let keys_x = line.find("500k").unwrap() as u16;
    assert_eq!(buf[(keys_x, y)].fg, ratatui::style::Color::DarkGray);
}

/// Errors per second are a column, red when not zero; the server's p50/p99 are columns.
#[test]
fn errors_and_server_latency_are_in_the_table() {
    let app = cluster(3, 3, Duration::ZERO);
    let text = screen(&app, 250, 45);
    assert_eq!(cell(&text, "10.0.0.1:7070", "ERR/S"), "2.0k", "{text}");
    assert_eq!(cell(&text, "10.0.0.2:7070", "ERR/S"), "0", "{text}");
    // Redirects (a slot move's MOVED and TRYAGAIN) are a column of their own, not errors.
    assert_eq!(cell(&text, "10.0.0.1:7070", "REDIR/S"), "1.0k", "{text}");
    assert_eq!(cell(&text, "10.0.0.1:7070", "P50"), "18 us", "{text}");
    assert_eq!(cell(&text, "10.0.0.1:7070", "P99"), "849 us", "{text}");
    assert_eq!(cell(&text, "10.0.0.2:7070", "P99"), "-", "{text}");
    let mut terminal = Terminal::new(TestBackend::new(250, 45)).unwrap();
    terminal.draw(|f| kvtui::ui::draw(f, &app)).unwrap();
    let buf = terminal.backend().buffer();
    let y = (0..45)
        .find(|&y| {
            let line: String = (0..40).map(|x| buf[(x, y)].symbol().to_string()).collect();
            line.contains("10.0.0.1:7070")
        })
        .unwrap();
    let line: String = (0..250).map(|x| buf[(x, y)].symbol().to_string()).collect();
    let x = line.find("2.0k").unwrap() as u16;
    assert_eq!(buf[(x, y)].fg, ratatui::style::Color::Red);
    assert!(text.contains("kvd p99 service time"), "{text}");
}

/// Every chart has its legend at 160x45, the network chart too.
#[test]
fn charts_have_legends_at_160x45() {
    let app = cluster(3, 3, Duration::ZERO);
    let text = screen(&app, 160, 45);
    // Each address: its table row and a legend entry in each of the four charts.
    let legends = text.lines().map(|l| l.matches("10.0.0.2:7070").count()).sum::<usize>();
    assert!(legends >= 5, "{legends} mentions:\n{text}");
    assert!(text.contains("kvd network in+out"), "{text}");
}

/// The help popup fits whole at 160x45, and `?` from the detail view returns there.
#[test]
fn help_fits_and_returns_to_where_it_was_opened() {
    use ratatui::crossterm::event::{KeyCode, KeyEvent};
    let mut app = cluster(3, 3, Duration::ZERO);
    app.on_key(KeyEvent::from(KeyCode::Enter));
    app.on_key(KeyEvent::from(KeyCode::Char('?')));
    let text = screen(&app, 160, 45);
    assert!(
        text.contains("select a node") && text.contains("says when --nodes does not match"),
        "{text}"
    );
    app.on_key(KeyEvent::from(KeyCode::Esc));
    assert_eq!(app.mode, Mode::Detail);
    app.on_key(KeyEvent::from(KeyCode::Char('?')));
    app.on_key(KeyEvent::from(KeyCode::Char('?')));
    assert_eq!(app.mode, Mode::Detail);
    app.on_key(KeyEvent::from(KeyCode::Esc));
    assert_eq!(app.mode, Mode::Table);
    assert!(!app.quit);
}

/// Nodes out of shard order, or two serving one shard: a red banner says so.
#[test]
fn a_banner_names_a_misconfigured_node_list() {
    let mut app = cluster(3, 3, Duration::ZERO);
    let t = app.now;
    let mut s = stats(0, 40_000, 0, 0, 0);
    s.shard.count = 3;
    app.view.apply(Sample {
        node: 1,
        at: t,
        result: Ok(s),
    });
    let text = screen(&app, 160, 45);
    assert!(
        text.contains("10.0.0.1:7070 and 10.0.0.2:7070 serve the same shard 0/3"),
        "{text}"
    );
}

/// The detail view gives the node's service time per op kind and its slowest map shards.
#[test]
fn the_detail_view_shows_service_times_and_the_slowest_map_shard() {
    let mut app = cluster(3, 3, Duration::ZERO);
    app.mode = Mode::Detail;
    let text = screen(&app, 200, 50);
    for needle in [
        "service time, last interval: get p50 18 us p99 849 us",
        "slowest map shards (p99, last interval): #1 2.9 ms (7 batches)",
    ] {
        assert!(text.contains(needle), "{needle} missing:\n{text}");
    }
}

/// A replica group on `--nodes` ("A|B|C"): a row per member saying its role, and the
/// followers' ops and keys are not added to the total again.
#[test]
fn a_replica_group_shows_a_row_per_member_with_its_role() {
    let mut app = App::new(
        &DashboardConfig {
            nodes: vec!["10.0.0.1:7070|10.0.0.2:7070|10.0.0.3:7070".into()],
            client: Default::default(),
            interval: Duration::from_millis(500),
            window: Duration::from_secs(60),
            record: None,
            replay: None,
        },
        false,
    );
    assert_eq!(app.view.nodes.len(), 3);
    let t0 = app.view.started;
    use kvshared::stats::GroupRole;
    for (node, role) in [
        (0usize, GroupRole::Follower),
        (1, GroupRole::Leader),
        (2, GroupRole::Follower),
    ] {
        for (at, gets) in [(t0, 0u64), (t0 + Duration::from_secs(2), 2_000)] {
            let mut s = stats(0, 10_000 + gets, gets, 0, 0);
            s.shard.count = 1;
            s.group.role = role;
            if role == GroupRole::Leader {
                // Three voters and a learner the shard manager added, and why.
                s.group.members = vec!["10.0.0.1:7070".into(), "10.0.0.2:7070".into(), "10.0.0.3:7070".into()];
                s.group.learners = vec!["10.0.0.9:7070".into()];
                s.group.changes = vec![kvshared::stats::GroupChange {
                    unix_ms: 1_795_508_639_411,
                    what: "10.0.0.9:7070 has caught up as a learner".into(),
                    why: "shard manager: hot for 3 intervals".into(),
                }];
            }
            app.view.apply(Sample {
                node,
                at,
                result: Ok(s),
            });
        }
    }
    app.now = t0 + Duration::from_secs(2);
    let text = screen(&app, 200, 40);
    assert_eq!(
        cell(&text, "10.0.0.2:7070", "STATE"),
        "★ leader ×4",
        "the leader is marked, with its group's size:\n{text}"
    );
    assert!(
        text.contains(
            "shard 0/1: changed 2026-11-24T08:23:59Z: 10.0.0.9:7070 has caught up as a learner (shard manager: hot for 3 intervals)"
        ),
        "the change and its reason are shown:\n{text}"
    );
    assert_eq!(cell(&text, "10.0.0.1:7070", "STATE"), "follower", "{text}");
    assert_eq!(cell(&text, "TOTAL", "OP/S"), "1.0k", "only the leader's ops:\n{text}");
    assert!(
        !text.contains("serve the same shard"),
        "a group is not a duplicate:\n{text}"
    );
}

/// Fsync times: 98 of 350 us and 2 of 2.14 ms (so the p99 falls among the slow ones).
fn fsync_times() -> kvshared::latency::Latency {
    let mut dense = vec![0; kvshared::latency::BUCKETS];
    dense[kvshared::latency::bucket_of(350_000)] = 98;
    dense[kvshared::latency::bucket_of(2_140_000)] = 2;
    kvshared::latency::Latency::from_dense(&dense, 98 * 350_000 + 2 * 2_140_000)
}
