//! Quantised weights: the formats the core reads in place, and the int8 quantiser.
//!
//! - [`BlockFormat`] / [`Blocks`]: the GGUF (ggml) block formats llama.cpp's files hold
//!   (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K … Q6_K), bit for bit as stored, and their encoders
//!   ([`BlockFormat::quantize_row`]), bit for bit what ggml's reference quantisers write.
//! - [`GroupFormat`] / [`Groups`]: group-wise int4 / int8 as compressed-tensors'
//!   `pack-quantized` checkpoints store it, with f32, bf16 or f16 scales and optional zero
//!   points, and their quantiser ([`quantize_groups`]), compressed-tensors' own arithmetic.
//! - int8 with one f32 scale per row ([`crate::Data::I8`]) and its quantiser
//!   ([`quantize_rows`], [`quantize_layer`]).
//!
//! Every format is a weight view ([`crate::Data`]); the projections accumulate in f32 with the
//! activations in f32, over the stored weights' exact values.

mod blocks;
mod encode;
mod encode_groups;
mod encode_k;
mod ggml_float;
mod groups;
mod rows;

pub use blocks::{BlockFormat, Blocks};
pub use encode_groups::{quantize_groups, GroupsOut, ScalesMut};
pub use groups::{GroupFormat, GroupRows, GroupTensors, Groups, Scales};
pub use rows::{quantize_layer, quantize_rows, quantized_len, QuantLen, I8_MAX};
