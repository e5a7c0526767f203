//! The one table a metric is declared in: [`metric_table!`] turns rows of name, help, unit
//! and labels into the fields of a struct of handles and their registration, and lists the
//! declarations for the checks (the generated docs/metrics.md, the label names /metrics shows).
//!
//! A row is `/// help` `name: Type = metric("stem", unit Seconds, labels ["reason"]),`:
//! its doc comment is both the field's doc and the `# HELP` text (lines joined, a final `.`
//! left to the encoder), so help is written once. The exposed name is
//! `ember_<stem>[_<unit>][_total]`, as prometheus-client builds it.

use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Metric, Registry, Unit};

/// The base units ember's own metrics use (the encoder appends them to the name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BaseUnit {
    /// `_seconds`.
    Seconds,
    /// `_bytes`.
    Bytes,
}

impl BaseUnit {
    /// The unit as prometheus-client takes it.
    pub fn unit(self) -> Unit {
        match self {
            BaseUnit::Seconds => Unit::Seconds,
            BaseUnit::Bytes => Unit::Bytes,
        }
    }

    /// The suffix the exposition adds to the name.
    pub fn as_str(self) -> &'static str {
        match self {
            BaseUnit::Seconds => "seconds",
            BaseUnit::Bytes => "bytes",
        }
    }
}

/// One metric as its table row declares it.
#[derive(Debug, Clone)]
pub struct Declared {
    /// The stem, without the `ember_` prefix, the unit or `_total`.
    pub name: &'static str,
    /// The help text, without the final `.` the encoder adds.
    pub help: String,
    /// Base unit, if any.
    pub unit: Option<BaseUnit>,
    /// Counter, gauge or histogram (from the handle's type).
    pub kind: MetricType,
    /// Label names, in the order the exposition writes them.
    pub labels: &'static [&'static str],
}

impl Declared {
    /// The name of its series on /metrics: `ember_<stem>[_<unit>][_total]` (a histogram's
    /// series add `_bucket`, `_sum`, `_count` to it).
    pub fn exposed(&self) -> String {
        let mut n = format!("ember_{}", self.name);
        if let Some(u) = self.unit {
            n.push('_');
            n.push_str(u.as_str());
        }
        if matches!(self.kind, MetricType::Counter) {
            n.push_str("_total");
        }
        n
    }
}

/// A struct of metric handles made by [`metric_table!`].
pub trait MetricSet: Sized {
    /// Makes every handle, registers it in `registry` (in table order) and creates the
    /// series a row asks for at start.
    fn register(registry: &mut Registry) -> Self;
    /// Appends the declaration of every metric of the set (nested sets included).
    fn declared(out: &mut Vec<Declared>);
}

/// The help text of a row: its doc lines trimmed and joined, without a final `.`.
pub fn help(lines: &[&str]) -> String {
    let joined = lines
        .iter()
        .map(|l| l.trim())
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    joined.strip_suffix('.').unwrap_or(&joined).to_owned()
}

/// Registers `metric` under `name` with `help` and, when given, `unit`.
pub fn register<M: Metric + Clone>(
    registry: &mut Registry,
    name: &'static str,
    help: String,
    unit: Option<BaseUnit>,
    metric: &M,
) {
    match unit {
        Some(u) => registry.register_with_unit(name, help, u.unit(), metric.clone()),
        None => registry.register(name, help, metric.clone()),
    }
}

/// Declares a struct of metric handles, one row per field, and implements [`MetricSet`]
/// for it. Each row is `/// doc` `vis field: Type = kind(args),` where kind is:
///
/// - `metric("stem" [, unit Seconds|Bytes] [, labels ["a", "b"]] [, new expr] [, start expr])`:
///   a metric; its doc is its help; `new` makes the handle (default: `Default`), `start`
///   gives label sets whose series exist from the start (at zero);
/// - `group()`: a nested [`MetricSet`], registered at this place in the order;
/// - `collector()`: a `Default + Clone` collector, registered at this place;
/// - `plain(expr)`: a field that is no metric, made by `expr`.
macro_rules! metric_table {
    (
        $(#[$smeta:meta])*
        $svis:vis struct $name:ident {
            $(
                $(#[doc = $doc:literal])*
                $fvis:vis $field:ident : $ty:ty = $how:ident ( $($args:tt)* ),
            )*
        }
    ) => {
        $(#[$smeta])*
        $svis struct $name {
            $( $(#[doc = $doc])* $fvis $field: $ty, )*
        }

        impl $crate::metrics::table::MetricSet for $name {
            fn register(registry: &mut ::prometheus_client::registry::Registry) -> Self {
                $(
                    let $field: $ty = $crate::metrics::table::metric_table!(
                        @make registry, [$($doc),*], $ty, $how($($args)*)
                    );
                )*
                Self { $($field,)* }
            }

            fn declared(out: &mut Vec<$crate::metrics::table::Declared>) {
                $(
                    $crate::metrics::table::metric_table!(
                        @declare out, [$($doc),*], $ty, $how($($args)*)
                    );
                )*
            }
        }
    };

    (@make $r:ident, [$($doc:literal),*], $ty:ty, metric(
        $stem:literal
        $(, unit $unit:ident)?
        $(, labels [$($label:literal),*])?
        $(, new $new:expr)?
        $(, start $start:expr)?
    )) => {{
        let m: $ty = $crate::metrics::table::metric_table!(@new $($new)?);
        $crate::metrics::table::register(
            $r,
            $stem,
            $crate::metrics::table::help(&[$($doc),*]),
            $crate::metrics::table::metric_table!(@unit $($unit)?),
            &m,
        );
        $(
            for labels in $start {
                let _ = m.get_or_create(&labels);
            }
        )?
        m
    }};
    (@make $r:ident, [$($doc:literal),*], $ty:ty, group()) => {
        <$ty as $crate::metrics::table::MetricSet>::register($r)
    };
    (@make $r:ident, [$($doc:literal),*], $ty:ty, collector()) => {{
        let c = <$ty>::default();
        $r.register_collector(Box::new(c.clone()));
        c
    }};
    (@make $r:ident, [$($doc:literal),*], $ty:ty, plain($init:expr)) => {
        $init
    };

    (@declare $out:ident, [$($doc:literal),*], $ty:ty, metric(
        $stem:literal
        $(, unit $unit:ident)?
        $(, labels [$($label:literal),*])?
        $(, new $new:expr)?
        $(, start $start:expr)?
    )) => {
        $out.push($crate::metrics::table::Declared {
            name: $stem,
            help: $crate::metrics::table::help(&[$($doc),*]),
            unit: $crate::metrics::table::metric_table!(@unit $($unit)?),
            kind: <$ty as ::prometheus_client::metrics::TypedMetric>::TYPE,
            labels: &[$($($label),*)?],
        })
    };
    (@declare $out:ident, [$($doc:literal),*], $ty:ty, group()) => {
        <$ty as $crate::metrics::table::MetricSet>::declared($out)
    };
    (@declare $out:ident, [$($doc:literal),*], $ty:ty, collector()) => {};
    (@declare $out:ident, [$($doc:literal),*], $ty:ty, plain($init:expr)) => {};

    (@new) => { Default::default() };
    (@new $new:expr) => { $new };
    (@unit) => { None };
    (@unit $unit:ident) => { Some($crate::metrics::table::BaseUnit::$unit) };
}

pub(crate) use metric_table;
