//! A Prometheus text exposition (format 0.0.4), parsed by `nom-openmetrics`, with the
//! lookups the tests use.

use std::collections::BTreeMap;

use nom_openmetrics::MetricDescriptor;

/// One sample line, labels unescaped.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A Prometheus text exposition (format 0.0.4), parsed by `nom-openmetrics`, with the
/// lookups the tests use.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    samples: Vec<Sample>,
    types: BTreeMap<String, String>,
    helps: BTreeMap<String, String>,
}

impl Metrics {
    /// Parse; Err names the offending line.
    pub fn parse(text: &str) -> Result<Metrics, String> {
        let mut m = Metrics::default();
        // Family by family (the crate's streaming entry point), so that an error can say
        // where parsing stopped.
        let mut rest = text;
        while !rest.is_empty() {
            let line = text[..text.len() - rest.len()].matches('\n').count() + 1;
            let Ok((next, family)) = nom_openmetrics::parser::family(rest) else {
                let bad = rest.lines().next().unwrap_or_default();
                return Err(format!(
                    "line {line}: not a HELP, TYPE or sample line: {bad:?}"
                ));
            };
            rest = next;
            for d in &family.descriptors {
                match d {
                    MetricDescriptor::Help { metric, help } => {
                        m.helps.insert(metric.to_string(), help.clone());
                    }
                    MetricDescriptor::Type { metric, r#type } => {
                        let t = match r#type {
                            nom_openmetrics::MetricType::Unknown(t) => t.to_string(),
                            known => known.to_string().to_ascii_lowercase(),
                        };
                        m.types.insert(metric.to_string(), t);
                    }
                    MetricDescriptor::Unit { .. } => {}
                }
            }
            // One descriptor or sample per line, so the sample's line is counted on.
            let first_sample = line + family.descriptors.len();
            for (i, s) in family.samples.iter().enumerate() {
                let mut labels = BTreeMap::new();
                for l in s.labels() {
                    // The crate takes a repeated label name; the format forbids it.
                    if labels.insert(l.name.to_string(), l.value.clone()).is_some() {
                        return Err(format!(
                            "line {}: duplicate label {} in {}",
                            first_sample + i,
                            l.name,
                            s.name()
                        ));
                    }
                }
                m.samples.push(Sample {
                    name: s.name().to_string(),
                    labels,
                    value: s.number(),
                });
            }
        }
        Ok(m)
    }

    /// All samples, in exposition order.
    pub fn samples(&self) -> &[Sample] {
        &self.samples
    }

    fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
    }

    /// Value of the one series named exactly `name` whose labels include `labels`.
    /// None when there is none; panics when several match (use `sum` or `series`).
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let found: Vec<&Sample> = self.matching(name, labels).collect();
        match found.len() {
            0 => None,
            1 => Some(found[0].value),
            _ => panic!(
                "Metrics::get({name}, {labels:?}) is ambiguous, {} series match: {:?}",
                found.len(),
                found.iter().map(|s| &s.labels).collect::<Vec<_>>()
            ),
        }
    }

    /// Sum over all series named `name` whose labels include `labels` (0 when none).
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels).map(|s| s.value).sum()
    }

    /// How many series named `name` have labels including `labels`.
    pub fn count(&self, name: &str, labels: &[(&str, &str)]) -> usize {
        self.matching(name, labels).count()
    }

    /// All series named exactly `name`.
    pub fn series(&self, name: &str) -> Vec<(BTreeMap<String, String>, f64)> {
        self.samples
            .iter()
            .filter(|s| s.name == name)
            .map(|s| (s.labels.clone(), s.value))
            .collect()
    }

    /// True when a sample named exactly `name` exists, or a `# TYPE` declares the
    /// family `name` (e.g. a histogram's base name) and it has samples.
    pub fn has(&self, name: &str) -> bool {
        if self.samples.iter().any(|s| s.name == name) {
            return true;
        }
        self.types.contains_key(name)
            && self.samples.iter().any(|s| {
                s.name.strip_prefix(name).is_some_and(|suf| {
                    ["_bucket", "_sum", "_count", "_total", "_created"].contains(&suf)
                })
            })
    }

    /// `# TYPE` of a family.
    pub fn type_of(&self, family: &str) -> Option<&str> {
        self.types.get(family).map(String::as_str)
    }

    /// `# HELP` of a family (unescaped).
    pub fn help(&self, family: &str) -> Option<&str> {
        self.helps.get(family).map(String::as_str)
    }

    /// Distinct sample names, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.samples.iter().map(|s| s.name.clone()).collect();
        v.sort();
        v.dedup();
        v
    }
}
