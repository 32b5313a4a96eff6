//! Tests of the Scaleway emulator.
