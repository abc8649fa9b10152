//! The macro that turns the one list of built-in strategies (built_in.rs) into the config
//! value, the table of names and [`AnyStrategy`](super::AnyStrategy), and the forwarding of
//! every [`ParallelStrategy`] phase through `AnyStrategy`.

/// Defines, from rows `Variant(Options) = "name" | "alias" => StrategyType;` (the options
/// optional): [`StrategyConfig`](super::StrategyConfig) (serde's shape, aliases included),
/// `BUILT_IN` (names, spellings and descriptions for the parser, its errors and `--help`),
/// and [`AnyStrategy`](super::AnyStrategy) with every phase forwarded.
macro_rules! built_in_strategies {
    ($(
        $(#[doc = $doc:literal])+
        $variant:ident $(($options:ty))? = $name:literal $(| $alias:literal)* => $strategy:ty;
    )+) => {
        /// How training is spread over devices, with the chosen strategy's options: a name
        /// (`strategy = "ddp"`, `--strategy ddp`) or a table of options under the name
        /// (`[strategy.diloco]` with `sync_every = 50`, `--diloco.sync-every 50`). A strategy
        /// of the user's is chosen by the name it was registered under
        /// ([`register_strategy`](crate::register_strategy)).
        #[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
        #[serde(remote = "Self")]
        pub enum StrategyConfig {
            $(
                $(#[doc = $doc])+
                #[serde(rename = $name $(, alias = $alias)*)]
                $variant $(($options))?,
            )+
            /// A strategy of the user's, by the name it was registered under, with its
            /// options.
            #[serde(skip)]
            Registered(crate::strategy::RegisteredConfig),
        }

        /// Every built-in strategy's names and description, in the list's order.
        pub(crate) const BUILT_IN: &[crate::strategy::BuiltIn] = &[$(
            crate::strategy::BuiltIn {
                name: $name,
                aliases: &[$($alias),*],
                about: concat!($($doc, "\n"),+),
            },
        )+];

        /// The strategy an [`Accelerator`](crate::Accelerator) trains with, built from the
        /// config's [`StrategyConfig`] by [`from_config`](AnyStrategy::from_config); `U` is
        /// a strategy of the user's that the config may choose by its registered name
        /// (none by default).
        pub enum AnyStrategy<B: AutodiffBackend, U: NamedStrategy<B> = NoStrategy> {
            $(
                $(#[doc = $doc])+
                $variant($strategy),
            )+
            /// The user's strategy `U`.
            User(U),
            /// `tp_size > 1`: the model's plan split over each tensor-parallel group, DDP
            /// across them ([`TensorParallelMesh`](afterburner_parallel::tp::TensorParallelMesh)).
            TensorParallel(afterburner_parallel::tp::TensorParallelMesh<B, crate::group::Group<B>>),
        }

        impl StrategyConfig {
            /// What option `key` of this strategy sets: its field's doc comment (a
            /// registered strategy's from [`NamedStrategy::option_about`]); `None` for a key
            /// it does not have.
            pub fn option_about(&self, key: &str) -> Option<&'static str> {
                $($(
                    if let Self::$variant(_) = self {
                        return <$options as documented::DocumentedFields>::get_field_docs(key).ok();
                    }
                )?)+
                match self {
                    Self::Registered(registered) => {
                        crate::strategy::named::option_about(registered.name(), key)
                    }
                    _ => None,
                }
            }
        }

        impl StrategyConfig {
            /// Whether the strategy this config chooses heals alone: its type's
            /// [`ParallelStrategy::HEALS_ALONE`](afterburner_parallel::ParallelStrategy::HEALS_ALONE)
            /// (`U`'s for the name `U` was registered under). A launched worker declares the
            /// restart policy it needs from it.
            pub fn heals_alone<B: AutodiffBackend, U: NamedStrategy<B>>(&self) -> bool {
                $(
                    if self.name() == $name {
                        return <$strategy as afterburner_parallel::ParallelStrategy<B>>::HEALS_ALONE;
                    }
                )+
                self.name() == U::NAME && U::HEALS_ALONE
            }
        }

        forward_every_phase!($($variant)+);
    };
}

/// `impl ParallelStrategy for AnyStrategy`: every method of the trait, forwarded to the
/// strategy the value holds (a test checks that no method of the trait is missing here).
macro_rules! forward_every_phase {
    ($($variant:ident)+) => {
        /// Calls `$call` on the strategy inside `$self`, whichever it is.
        macro_rules! dispatch {
            ($self_:expr, $s_:ident => $call_:expr) => {
                match $self_ {
                    $(AnyStrategy::$variant($s_) => $call_,)+
                    AnyStrategy::User($s_) => $call_,
                    AnyStrategy::TensorParallel($s_) => $call_,
                }
            };
        }
        forward_impl!();
    };
}
