//! The store's write policy: what a write may make, and whether it runs outside the log.

/// How the store treats writes (set once, before it serves).
pub(super) struct WritePolicy {
    /// Writes run only when applied from a log entry (a durable node's store); see
    /// `Store::writes_through_log_only`.
    pub(super) log_only: bool,
    /// The longest value an append or range write may make (see `Store::cap_values`).
    pub(super) value_cap: u64,
}

impl Default for WritePolicy {
    fn default() -> WritePolicy {
        WritePolicy {
            log_only: false,
            value_cap: kvshared::wire::MAX_STRING,
        }
    }
}

impl WritePolicy {
    /// Caps values at `max` bytes, never above the wire's longest string.
    pub(super) fn cap_values(&mut self, max: u64) {
        self.value_cap = max.min(kvshared::wire::MAX_STRING);
    }
}

#[cfg(test)]
mod tests {
    use super::WritePolicy;

    #[test]
    fn a_value_cap_never_exceeds_the_wires_longest_string() {
        let mut p = WritePolicy::default();
        assert_eq!(p.value_cap, kvshared::wire::MAX_STRING);
        p.cap_values(4096);
        assert_eq!(p.value_cap, 4096);
        p.cap_values(u64::MAX);
        assert_eq!(p.value_cap, kvshared::wire::MAX_STRING);
        assert!(!p.log_only);
    }
}
