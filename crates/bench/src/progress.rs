//! Progress for a long benchmark: one bar over the planned seconds of all
//! steps, its message naming the step running now, moved by a ticker thread
//! so it advances during a step (elapsed and time left are shown). When
//! stderr is not a terminal the bar is hidden and each step is announced
//! on one line instead.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

struct State {
    /// Planned seconds of the finished steps.
    done: f64,
    /// The running step: start and planned seconds.
    step: Option<(Instant, f64)>,
}

pub struct Progress {
    bar: ProgressBar,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    ticker: Option<std::thread::JoinHandle<()>>,
    steps: usize,
    index: usize,
    plain: bool,
}

impl Progress {
    /// `total` planned seconds over `steps` steps.
    pub fn new(total: f64, steps: usize) -> Progress {
        let plain = !std::io::stderr().is_terminal();
        let bar = ProgressBar::with_draw_target(
            Some(total.ceil().max(1.0) as u64),
            if plain {
                ProgressDrawTarget::hidden()
            } else {
                ProgressDrawTarget::stderr()
            },
        );
        bar.set_style(
            ProgressStyle::with_template(
                "{msg:50!} [{elapsed_precise}] [{bar:30}] {pos}/{len} s, ~{eta} left",
            )
            .expect("valid template")
            .progress_chars("=> "),
        );
        let state = Arc::new(Mutex::new(State {
            done: 0.0,
            step: None,
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let (b, s, st) = (bar.clone(), state.clone(), stop.clone());
        let ticker = std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                {
                    let g = s.lock().expect("progress state");
                    let running = g
                        .step
                        .map(|(t, plan)| t.elapsed().as_secs_f64().min(plan))
                        .unwrap_or(0.0);
                    b.set_position((g.done + running) as u64);
                }
                std::thread::sleep(std::time::Duration::from_millis(250));
            }
        });
        Progress {
            bar,
            state,
            stop,
            ticker: Some(ticker),
            steps,
            index: 0,
            plain,
        }
    }

    /// Starts the next step (the previous one, if any, counts as done).
    pub fn step(&mut self, what: &str, planned: f64) {
        self.finish_step();
        self.index += 1;
        let msg = format!("[{}/{}] {what}", self.index, self.steps);
        if self.plain {
            eprintln!("tiercache bench: {msg} (~{planned:.0} s)");
        }
        self.bar.set_message(msg);
        self.state.lock().expect("progress state").step = Some((Instant::now(), planned));
    }

    fn finish_step(&mut self) {
        let mut g = self.state.lock().expect("progress state");
        if let Some((_, plan)) = g.step.take() {
            g.done += plan;
        }
    }

    /// Prints a line above the bar.
    pub fn println(&self, line: &str) {
        if self.plain {
            eprintln!("{line}");
        } else {
            self.bar.println(line);
        }
    }

    pub fn finish(mut self) {
        self.finish_step();
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.ticker.take() {
            let _ = t.join();
        }
        self.bar.finish_and_clear();
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.shutdown();
    }
}
