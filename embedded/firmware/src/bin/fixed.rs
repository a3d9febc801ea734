//! int8 weights in flash, integer-only path: every token through `decode_step_fixed`, per gate form.
#![no_std]
#![no_main]

use kda_embedded_firmware::FwSink;
use kda_embedded_model as model;

static mut BUFS: model::FixedBufs = model::FixedBufs::new();

#[cortex_m_rt::entry]
fn main() -> ! {
    kda_embedded_firmware::paint_stack();
    let mut sink = FwSink::new("kda-fixed");
    // SAFETY: the only reference to BUFS, taken once.
    let bufs = unsafe { &mut *core::ptr::addr_of_mut!(BUFS) };
    let r = model::i8_weights().and_then(|w| model::run_fixed(&w, bufs, &mut sink));
    sink.finish(r)
}
