//! Logging macros. The host writes each line under the span of the current operation and
//! removes secrets, so plugins log through it rather than stdout (which the host treats
//! as an unstructured, capped side channel).

/// Log at an explicit [`Level`](crate::Level) with `format!` arguments.
#[macro_export]
macro_rules! log {
    ($level:expr, $($arg:tt)+) => {
        $crate::host::log($level, &::std::format!($($arg)+))
    };
}

/// Log at trace level.
#[macro_export]
macro_rules! trace {
    ($($arg:tt)+) => { $crate::log!($crate::Level::Trace, $($arg)+) };
}

/// Log at debug level.
#[macro_export]
macro_rules! debug {
    ($($arg:tt)+) => { $crate::log!($crate::Level::Debug, $($arg)+) };
}

/// Log at info level.
#[macro_export]
macro_rules! info {
    ($($arg:tt)+) => { $crate::log!($crate::Level::Info, $($arg)+) };
}

/// Log at warn level.
#[macro_export]
macro_rules! warn {
    ($($arg:tt)+) => { $crate::log!($crate::Level::Warn, $($arg)+) };
}

/// Log at error level.
#[macro_export]
macro_rules! error {
    ($($arg:tt)+) => { $crate::log!($crate::Level::Error, $($arg)+) };
}

#[cfg(test)]
mod tests {
    #[test]
    fn macros_expand_natively() {
        let id = "i-1";
        crate::trace!("t {id}");
        crate::debug!("d {}", 1);
        crate::info!("i");
        crate::warn!("w {id}");
        crate::error!("e {:?}", id);
    }
}
