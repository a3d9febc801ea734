//! Board support for the example firmware on QEMU's mps2-an385 (Cortex-M3) and mps2-an386
//! (Cortex-M4F): semihosting output, an instruction counter, stack painting, exit codes.
//!
//! **Counting instructions.** QEMU run with `-icount shift=0` advances its virtual clock by
//! exactly 2^0 = 1 ns per executed instruction, and the boards' CMSDK APB timer 0 (0x4000_0000)
//! counts down at the 25 MHz peripheral clock of that virtual time: one tick per 40
//! instructions. [`Counter`] reads it around a region; the resolution is 40 instructions, and
//! every run starts with a calibration loop of known length ([`calibrate`]) whose result the
//! host checks (it must come out at 40 instructions a tick). Semihosting's own clocks
//! (`SYS_CLOCK`, `SYS_ELAPSED`) are host wall time in QEMU, not virtual time, so they cannot be
//! used for this.
//!
//! **Stack.** [`paint_stack`] fills the free RAM below the stack pointer with a pattern at
//! start; [`stack_high_water`] finds the deepest word that was overwritten.
#![no_std]

use core::fmt::Write as _;
use core::ptr::{read_volatile, write_volatile};

use cortex_m_semihosting::{debug, hio};
#[cfg(feature = "defmt")]
use defmt_semihosting as _;
use kda_core::KdaError;
use kda_embedded_model::{Gate, Phase, Sink};

/// CMSDK APB timer 0.
const TIMER0: usize = 0x4000_0000;
const CTRL: *mut u32 = TIMER0 as *mut u32;
const VALUE: *mut u32 = (TIMER0 + 4) as *mut u32;
const RELOAD: *mut u32 = (TIMER0 + 8) as *mut u32;

/// Instructions per timer tick under `-icount shift=0` (1 ns per instruction, 25 MHz timer).
pub const INSTR_PER_TICK: u32 = 40;

/// The free-running down-counter of timer 0.
pub struct Counter;

impl Counter {
    /// Starts timer 0 from `u32::MAX`, counting down, no interrupt.
    pub fn init() -> Counter {
        // SAFETY: timer 0's registers exist on both boards; nothing else uses the timer.
        unsafe {
            write_volatile(CTRL, 0);
            write_volatile(RELOAD, u32::MAX);
            write_volatile(VALUE, u32::MAX);
            write_volatile(CTRL, 1);
        }
        Counter
    }

    /// The current count (decreasing).
    #[inline(always)]
    pub fn now(&self) -> u32 {
        // SAFETY: a plain read of a timer register.
        unsafe { read_volatile(VALUE) }
    }
}

/// Runs a loop of exactly `2·n` instructions (`subs`, `bne`) between two counter reads;
/// returns `(2·n, ticks)`.
pub fn calibrate(c: &Counter, n: u32) -> (u32, u32) {
    let t0 = c.now();
    // SAFETY: a register-only countdown loop.
    unsafe {
        core::arch::asm!(
            "2:",
            "subs {0}, #1",
            "bne 2b",
            inout(reg) n => _,
            options(nomem, nostack),
        );
    }
    let t1 = c.now();
    (2 * n, t0.wrapping_sub(t1))
}

const PATTERN: u32 = 0x5AC3_A55C;
/// How far below the stack pointer at start the stack is painted (and can be measured).
const PAINT: usize = 128 * 1024;

extern "C" {
    static _stack_start: u32;
    static mut _stack_end: u32;
}

fn sp() -> usize {
    let sp: usize;
    // SAFETY: reads the stack pointer.
    unsafe { core::arch::asm!("mov {}, sp", out(reg) sp, options(nomem, nostack)) };
    sp
}

fn paint_bounds() -> (usize, usize) {
    // Only the linker symbols' addresses are taken.
    let (top, end) = (
        core::ptr::addr_of!(_stack_start) as usize,
        core::ptr::addr_of!(_stack_end) as usize,
    );
    (top, end.max(top - PAINT))
}

/// Fills `[max(end of .bss, top − 128 KiB), sp − 64)` with a pattern. Call first thing.
#[inline(never)]
pub fn paint_stack() {
    let (_, lo) = paint_bounds();
    let hi = sp() - 64;
    let mut a = lo;
    while a < hi {
        // SAFETY: free RAM between the end of .bss and the live stack.
        unsafe { write_volatile(a as *mut u32, PATTERN) };
        a += 4;
    }
}

/// Bytes of stack used so far at most (from the top of RAM to the deepest overwritten word).
pub fn stack_high_water() -> usize {
    let (top, lo) = paint_bounds();
    let mut a = lo;
    // SAFETY: reads the painted region.
    while a < top && unsafe { read_volatile(a as *const u32) } == PATTERN {
        a += 4;
    }
    top - a
}

/// A line buffer on semihosting stdout (one `SYS_WRITE` per line).
pub struct Out {
    line: heapless::String<1024>,
    io: Option<hio::HostStream>,
}

impl Out {
    /// Opens the host's stdout.
    pub fn new() -> Out {
        Out {
            line: heapless::String::new(),
            io: hio::hstdout().ok(),
        }
    }

    /// Writes the buffered line and a newline.
    pub fn end_line(&mut self) {
        let _ = self.line.push('\n');
        self.flush();
    }

    fn flush(&mut self) {
        if let Some(io) = self.io.as_mut() {
            let _ = io.write_all(self.line.as_bytes());
        }
        self.line.clear();
    }
}

impl Default for Out {
    fn default() -> Self {
        Self::new()
    }
}

impl core::fmt::Write for Out {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        if self.line.len() + s.len() > self.line.capacity() {
            self.flush();
        }
        self.line.push_str(s).map_err(|_| core::fmt::Error)
    }
}

/// The firmware's [`Sink`]: times regions with the [`Counter`] and prints everything.
///
/// Log lines: `KDA <name>`, `CAL <instructions> <ticks>`, `T <gate> <prefill|decode> <token>
/// <ticks>`, `O <gate> <token> <64 × f32 bits, hex>`, `Q <gate> <token> <64 × i32, hex>`,
/// `STACK <bytes>`, `ERR <message>`, `DONE`.
pub struct FwSink {
    /// The output.
    pub out: Out,
    counter: Counter,
    t0: u32,
}

impl FwSink {
    /// Prints the header and the calibration.
    pub fn new(name: &str) -> FwSink {
        let mut out = Out::new();
        let counter = Counter::init();
        let _ = write!(out, "KDA {name}");
        out.end_line();
        #[cfg(feature = "defmt")]
        defmt::info!(
            "{=str}: {}",
            name,
            kda_embedded_model::config(Gate::LowerBound)
        );
        let (n, ticks) = calibrate(&counter, 100_000);
        let _ = write!(out, "CAL {n} {ticks}");
        out.end_line();
        FwSink {
            out,
            counter,
            t0: 0,
        }
    }

    /// Prints the stack high-water mark and the result, and exits QEMU (status 0 on success).
    pub fn finish(mut self, r: Result<(), KdaError>) -> ! {
        #[cfg(feature = "defmt")]
        if let Err(e) = &r {
            defmt::error!("kda: {}", e);
        }
        let _ = write!(self.out, "STACK {}", stack_high_water());
        self.out.end_line();
        let ok = r.is_ok();
        if let Err(e) = r {
            let _ = write!(self.out, "ERR {e}");
            self.out.end_line();
        } else {
            let _ = write!(self.out, "DONE");
            self.out.end_line();
        }
        exit(ok)
    }

    /// Times `f` and prints `T <label> <ticks>`.
    pub fn time<R>(&mut self, label: &str, f: impl FnOnce() -> R) -> R {
        let t0 = self.counter.now();
        let r = f();
        let t = t0.wrapping_sub(self.counter.now());
        let _ = write!(self.out, "T {label} {t}");
        self.out.end_line();
        r
    }
}

fn phase_name(p: Phase) -> &'static str {
    match p {
        Phase::Prefill => "prefill",
        Phase::Decode => "decode",
    }
}

impl Sink for FwSink {
    #[inline(always)]
    fn start(&mut self) {
        self.t0 = self.counter.now();
    }

    #[inline(always)]
    fn stop(&mut self, gate: Gate, phase: Phase, token: usize) {
        let t = self.t0.wrapping_sub(self.counter.now());
        let _ = write!(
            self.out,
            "T {} {} {} {}",
            gate.name(),
            phase_name(phase),
            token,
            t
        );
        self.out.end_line();
    }

    fn out_f32(&mut self, gate: Gate, tokens: core::ops::Range<usize>, rows: &[f32]) {
        for (t, row) in tokens.zip(rows.chunks_exact(kda_embedded_model::synth::HIDDEN)) {
            let _ = write!(self.out, "O {} {}", gate.name(), t);
            for v in row {
                let _ = write!(self.out, " {:08x}", v.to_bits());
            }
            self.out.end_line();
        }
    }

    fn out_q16(&mut self, gate: Gate, token: usize, row: &[i32]) {
        let _ = write!(self.out, "Q {} {}", gate.name(), token);
        for v in row {
            let _ = write!(self.out, " {:08x}", *v as u32);
        }
        self.out.end_line();
    }
}

/// Ends the QEMU run: semihosting exit with success or failure.
pub fn exit(ok: bool) -> ! {
    debug::exit(if ok {
        debug::EXIT_SUCCESS
    } else {
        debug::EXIT_FAILURE
    });
    loop {
        cortex_m::asm::bkpt();
    }
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    let mut out = Out::new();
    let _ = write!(out, "PANIC {info}");
    out.end_line();
    exit(false)
}

#[cortex_m_rt::exception]
unsafe fn HardFault(_: &cortex_m_rt::ExceptionFrame) -> ! {
    let mut out = Out::new();
    let _ = write!(out, "HARDFAULT");
    out.end_line();
    exit(false)
}
