//! Compile bombs: a real plugin with one more core module in it, whose compile is slow
//! and large.
//!
//! The component keeps the plugin's own imports and exports (the `egress:provider@0.1.0`
//! world, as built), so every check before the compile passes; the added module is never
//! instantiated, but wasmtime compiles every core module of a component. Made at test time
//! from bytes (a few microseconds, nothing to build): a module section appended at the end
//! of a component is a module like any other.
//!
//! The module's one function makes `calls` `call_indirect`s whose results all stay live
//! until a chain of `i32.add`s at the end: register allocation over that many live values
//! grows with the square of the count. Measured without limits (`compile-plugin`, the
//! dev-profile build, example.wasm plus the module):
//!
//! | calls | added | CPU time | peak RSS |
//! |---|---|---|---|
//! | 2,500 | 20 KB | 2.5 s | 217 MiB |
//! | 5,000 | 40 KB | 11.6 s | 657 MiB |
//! | 10,000 | 80 KB | 70 s | 2.3 GiB |
//! | 20,000 | 160 KB | more than 280 s (stopped at 300 s wall) | 8.5 GiB and growing |
//!
//! [`BOMB_CALLS`] is the last row, as in the report that found it (a ~100 KB component with
//! 20,000 `call_indirect`s). Never compile it without limits.
//!
//! [`slow`] spreads the cost over many functions of direct calls instead, which take less
//! memory: without limits it took 44 s of CPU (25 s on two cores) and 200 MiB at its peak,
//! growing with the code compiled so far (112 MiB after 19 s of CPU). So with memory to
//! spare (the operator test's `--plugin-compile-memory`) the CPU-time limit stops it; under
//! the default 128 MiB the memory limit may come first, as it does for the bomb.

/// The bomb's indirect calls.
pub const BOMB_CALLS: u32 = 20_000;

/// The slow module: 80 functions of 5,000 direct calls (2.2 MB), each compiled in about
/// 0.55 s of CPU and 25 MiB, together more than twice the default CPU-time limit.
pub const SLOW_FUNCTIONS: u32 = 80;
pub const SLOW_CALLS: u32 = 5_000;

/// Appends `n` as unsigned LEB128, the wasm binary format's integers.
pub fn leb(mut n: u64, out: &mut Vec<u8>) {
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn section(id: u8, content: &[u8], out: &mut Vec<u8>) {
    out.push(id);
    leb(content.len() as u64, out);
    out.extend_from_slice(content);
}

/// A core module of `functions` functions `(param i32) (result i32)`, each with `body`
/// (its code, `end` included), and a one-entry funcref table for `call_indirect`.
fn module_with_bodies(functions: u32, body: &[u8]) -> Vec<u8> {
    let mut m = b"\0asm\x01\0\0\0".to_vec();
    // type 0: (func (param i32) (result i32))
    section(1, &[1, 0x60, 1, 0x7f, 1, 0x7f], &mut m);
    // every function has type 0
    let mut types = Vec::new();
    leb(u64::from(functions), &mut types);
    types.extend(std::iter::repeat_n(0, functions as usize));
    section(3, &types, &mut m);
    // table 0: funcref, min 1
    section(4, &[1, 0x70, 0, 1], &mut m);
    // code: the bodies, no locals
    let mut func = vec![0];
    func.extend_from_slice(body);
    let mut code = Vec::new();
    leb(u64::from(functions), &mut code);
    for _ in 0..functions {
        leb(func.len() as u64, &mut code);
        code.extend_from_slice(&func);
    }
    section(10, &code, &mut m);
    m
}

/// How the bomb's functions call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Calls {
    /// `call_indirect` through the table: the most code and compile memory per call.
    Indirect,
    /// `call` of function 0: less code and memory per call, the same square in CPU time.
    Direct,
}

/// `functions` functions of `calls` calls each, every result live to the end.
pub fn bomb_module(functions: u32, calls: u32, how: Calls) -> Vec<u8> {
    let mut body = Vec::with_capacity(calls as usize * 8);
    for _ in 0..calls {
        match how {
            // local.get 0; i32.const 0; call_indirect (type 0) (table 0)
            Calls::Indirect => body.extend_from_slice(&[0x20, 0, 0x41, 0, 0x11, 0, 0]),
            // local.get 0; call 0
            Calls::Direct => body.extend_from_slice(&[0x20, 0, 0x10, 0]),
        }
    }
    // i32.add the results together: calls - 1 adds leave one i32.
    body.extend(std::iter::repeat_n(0x6a, calls.saturating_sub(1) as usize));
    body.push(0x0b);
    module_with_bodies(functions, &body)
}

/// A module that does not validate: `i32.add` on an empty stack.
pub fn invalid_module() -> Vec<u8> {
    module_with_bodies(1, &[0x6a, 0x0b])
}

/// `component` with `module` appended as one more core module.
pub fn with_core_module(component: &[u8], module: &[u8]) -> Vec<u8> {
    let mut out = component.to_vec();
    section(1, module, &mut out);
    out
}

/// `component` (a real plugin) made into a compile bomb: one function of [`BOMB_CALLS`].
/// Under the default limits, the memory limit stops it (in about 0.3 s).
pub fn bomb(component: &[u8]) -> Vec<u8> {
    with_core_module(component, &bomb_module(1, BOMB_CALLS, Calls::Indirect))
}

/// `component` made slow to compile, in less memory: [`SLOW_FUNCTIONS`] functions of
/// [`SLOW_CALLS`] direct calls each.
pub fn slow(component: &[u8]) -> Vec<u8> {
    with_core_module(
        component,
        &bomb_module(SLOW_FUNCTIONS, SLOW_CALLS, Calls::Direct),
    )
}
