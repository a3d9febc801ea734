//! int8 weights (per-row scales) in flash, float path: a chunked 8-token prefill and 4 decode steps per gate form.
#![no_std]
#![no_main]

use kda_embedded_firmware::FwSink;
use kda_embedded_model as model;

static mut BUFS: model::FloatBufs = model::FloatBufs::new();

#[cortex_m_rt::entry]
fn main() -> ! {
    kda_embedded_firmware::paint_stack();
    let mut sink = FwSink::new("kda-i8");
    // SAFETY: the only reference to BUFS, taken once.
    let bufs = unsafe { &mut *core::ptr::addr_of_mut!(BUFS) };
    let r = model::i8_weights().and_then(|w| model::run_float(&w, bufs, &mut sink));
    sink.finish(r)
}
