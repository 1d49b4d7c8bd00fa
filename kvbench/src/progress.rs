//! Progress while a run goes: a bar on a terminal, a plain line every few seconds otherwise.
//! Always on stderr, so stdout stays clean for `--json -`.

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use kvshared::units::si;

use crate::engine::Live;

/// Shows progress of the run watched through `live` until it stops.
pub async fn watch(live: Arc<Live>, total: Duration) {
    let terminal = std::io::stderr().is_terminal();
    let bar = terminal.then(|| {
        let bar = ProgressBar::new(total.as_millis() as u64);
        bar.set_style(
            ProgressStyle::with_template("{spinner} [{elapsed_precise}] {wide_bar} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar
    });
    // Wake often so the display stops as soon as the run does; print plain lines less often.
    let print_every = if terminal {
        Duration::from_millis(250)
    } else {
        Duration::from_secs(5)
    };
    let mut last = (Instant::now(), 0u64);
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    tick.tick().await;
    loop {
        tick.tick().await;
        if live.stop.load(Ordering::Relaxed) {
            break;
        }
        if last.0.elapsed() < print_every {
            continue;
        }
        let now = Instant::now();
        let done = live.completed.load(Ordering::Relaxed);
        let rate = (done - last.1) as f64 / now.duration_since(last.0).as_secs_f64().max(1e-9);
        last = (now, done);
        let phase = if live.in_warmup() { "warm-up" } else { "measuring" };
        let failed = live.failed.load(Ordering::Relaxed);
        let failed = if failed > 0 {
            format!(", {failed} failed")
        } else {
            String::new()
        };
        let elapsed = now.duration_since(live.started);
        match &bar {
            Some(b) => {
                b.set_position(elapsed.as_millis() as u64);
                b.set_message(format!("{phase}: {} op/s{failed}", si(rate)));
            }
            None => eprintln!(
                "kvbench: {:>5.1}s/{:.0}s {phase}: {} op/s{failed}",
                elapsed.as_secs_f64(),
                total.as_secs_f64(),
                si(rate)
            ),
        }
    }
    if let Some(b) = bar {
        b.finish_and_clear();
    }
}
