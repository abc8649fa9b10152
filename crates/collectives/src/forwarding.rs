//! A check for decorators and dispatching enums that must forward every method of a trait
//! (a method left out would silently run the trait's default): reads the methods a trait
//! declares and those an impl block defines from the source text. Feature `testing`.

/// The `fn` names declared in the block that starts at the first `start` in `source` (up to
/// its matching closing brace).
pub fn fn_names(source: &str, start: &str) -> Vec<String> {
    let Some(at) = source.find(start) else {
        return Vec::new();
    };
    let block = &source[at..];
    let mut depth = 0usize;
    let mut end = block.len();
    for (i, c) in block.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 1 => {
                end = i;
                break;
            }
            '}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    block[..end]
        .split("fn ")
        .skip(1)
        .filter_map(|rest| {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            (!name.is_empty()).then_some(name)
        })
        .collect()
}

/// The methods of the trait whose block starts with `trait_start` in `trait_source` that the
/// impl block starting with `impl_start` in `impl_source` does not define. Panics when either
/// block is missing (the check would pass vacuously).
pub fn not_forwarded(
    trait_source: &str,
    trait_start: &str,
    impl_source: &str,
    impl_start: &str,
) -> Vec<String> {
    let declared = fn_names(trait_source, trait_start);
    let defined = fn_names(impl_source, impl_start);
    assert!(!declared.is_empty(), "no trait block at {trait_start:?}");
    assert!(!defined.is_empty(), "no impl block at {impl_start:?}");
    declared
        .into_iter()
        .filter(|m| !defined.contains(m))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GROUP: &str = include_str!("group.rs");
    const TRAIT: &str = "pub trait ProcessGroup<B: Backend>: Send {";

    /// The one forwarding of a process group's methods, which every decorator (counted,
    /// shared, slow link, boxed) gets from `forward_process_group!`, forwards every method of
    /// the trait, so the engine's own runs behind a decorator (a default would compose it from
    /// all-reduces, or lose the quorum).
    #[test]
    fn the_decorators_forwarding_forwards_every_method() {
        assert!(fn_names(GROUP, TRAIT).len() >= 8);
        let missing = not_forwarded(
            GROUP,
            TRAIT,
            include_str!("decorator.rs"),
            "macro_rules! forward_process_group {",
        );
        assert!(
            missing.is_empty(),
            "forward_process_group! lacks {missing:?}"
        );
    }

    #[test]
    fn a_method_left_out_is_found() {
        let source =
            "trait T { fn a(&self) {} fn b(&self) { if x { y } } } impl T for S { fn a(&self) {} }";
        assert_eq!(
            not_forwarded(source, "trait T {", source, "impl T for S {"),
            ["b"]
        );
    }
}
