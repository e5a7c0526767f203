//! `/api/flamegraph`'s tree and top-functions table, built window by window.
//!
//! A flame graph of a range is the sum of its windows' flame graphs, so each window is
//! added to the tree as it is decoded and dropped: no merged profile is held. The cost
//! is bounded by what the tree holds, not by what the windows hold:
//! - at most `server.max_flame_nodes` nodes (a node is about 60 bytes here, with its
//!   child index entry): past it [`FlameError::TooManyNodes`], a 413;
//! - frame names are interned once (a name is shared by every node that shows it) and
//!   looked up by id through per-window hash maps (functions, mappings, locations), never
//!   by scanning the window's tables per frame;
//! - the caller's [`Work`] is polled per sample, so a deadline or a client that left
//!   stops the work within a few hundred samples.

use std::collections::HashMap;

use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};

use super::limits::{Stopped, Work};
use super::merge::{str_at, LabelFilter};
use crate::encode::flamegraph::INLINED;
use crate::proto::Profile;

/// Rows of the top-functions table.
const MAX_TOP: usize = 500;
/// Frames of one stack that go into the tree (inline frames count); deeper frames are
/// left out (counted in `truncated`), which also bounds the serializer's recursion.
const MAX_DEPTH: usize = 1024;
/// No node.
const NONE: u32 = u32::MAX;

/// Why a flame graph could not be built.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(super) enum FlameError {
    /// The tree would hold more nodes than allowed.
    #[error(
        "the flame graph of the range has more than {cap} nodes (server.max_flame_nodes): \
         narrow the time range or filter by a label"
    )]
    TooManyNodes {
        /// The cap.
        cap: usize,
    },
    /// The windows do not share sample types (e.g. a CPU and an off-CPU profile).
    #[error("window sample types differ from the first window's")]
    SampleTypes,
    /// The request's deadline passed, or it went away.
    #[error("{0}")]
    Stopped(#[from] Stopped),
}

/// A node: its name (an interned id), its value (children included) and its links.
struct TreeNode {
    name: u32,
    value: i64,
    first_child: u32,
    last_child: u32,
    next_sibling: u32,
    /// Some sample's stack ends here.
    leaf: bool,
}

/// The tree and table under construction.
pub(super) struct Flame {
    max_nodes: usize,
    names: Vec<String>,
    name_ids: HashMap<String, u32>,
    /// `nodes[0]` is the root, `all`.
    nodes: Vec<TreeNode>,
    /// (parent, name) → child.
    children: HashMap<(u32, u32), u32>,
    /// Per name: (flat, cum) and the last sample that counted its cum.
    top: Vec<(i64, i64, u64)>,
    /// The first window's sample types (type, unit).
    sample_types: Option<Vec<(String, String)>>,
    stacks: usize,
    truncated: usize,
    /// Samples added, the stamp of `top`'s once-per-stack count.
    samples: u64,
    path: Vec<u32>,
}

impl Flame {
    /// An empty tree that may grow to `max_nodes` nodes (the root included).
    pub(super) fn new(max_nodes: usize) -> Self {
        let mut f = Self {
            max_nodes,
            names: Vec::new(),
            name_ids: HashMap::new(),
            nodes: Vec::new(),
            children: HashMap::new(),
            top: Vec::new(),
            sample_types: None,
            stacks: 0,
            truncated: 0,
            samples: 0,
            path: Vec::new(),
        };
        let all = f.intern("all");
        f.nodes.push(TreeNode {
            name: all,
            value: 0,
            first_child: NONE,
            last_child: NONE,
            next_sibling: NONE,
            leaf: false,
        });
        f
    }

    fn intern(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.name_ids.get(name) {
            return id;
        }
        let id = u32::try_from(self.names.len()).unwrap_or(NONE - 1);
        self.names.push(name.to_string());
        self.name_ids.insert(name.to_string(), id);
        self.top.push((0, 0, 0));
        id
    }

    /// The child of `parent` named `name`, made if new (within the node cap).
    fn child(&mut self, parent: u32, name: u32) -> Result<u32, FlameError> {
        if let Some(&c) = self.children.get(&(parent, name)) {
            return Ok(c);
        }
        if self.nodes.len() >= self.max_nodes {
            return Err(FlameError::TooManyNodes {
                cap: self.max_nodes,
            });
        }
        let id = u32::try_from(self.nodes.len()).map_err(|_| FlameError::TooManyNodes {
            cap: self.max_nodes,
        })?;
        self.nodes.push(TreeNode {
            name,
            value: 0,
            first_child: NONE,
            last_child: NONE,
            next_sibling: NONE,
            leaf: false,
        });
        self.children.insert((parent, name), id);
        let p = &mut self.nodes[parent as usize];
        let last = p.last_child;
        p.last_child = id;
        if last == NONE {
            p.first_child = id;
        } else {
            self.nodes[last as usize].next_sibling = id;
        }
        Ok(id)
    }

    /// Adds the samples of `p` that `filter` keeps, by their first value.
    pub(super) fn add(
        &mut self,
        p: &Profile,
        filter: &LabelFilter,
        work: &Work,
    ) -> Result<(), FlameError> {
        let types: Vec<(String, String)> = p
            .sample_type
            .iter()
            .map(|t| {
                (
                    str_at(p, t.r#type).to_string(),
                    str_at(p, t.unit).to_string(),
                )
            })
            .collect();
        match &self.sample_types {
            None => self.sample_types = Some(types),
            Some(first) if *first != types => return Err(FlameError::SampleTypes),
            Some(_) => {}
        }
        let mut frames = Frames::new(p, work)?;
        let mut path = std::mem::take(&mut self.path);
        let added = self.add_samples(p, filter, work, &mut frames, &mut path);
        self.path = path;
        added
    }

    fn add_samples(
        &mut self,
        p: &Profile,
        filter: &LabelFilter,
        work: &Work,
        frames: &mut Frames<'_>,
        path: &mut Vec<u32>,
    ) -> Result<(), FlameError> {
        for s in &p.sample {
            work.tick()?;
            if !filter.keeps(p, s) {
                continue;
            }
            let v = s.value.first().copied().unwrap_or(0);
            // Root first: the sample lists the leaf first.
            path.clear();
            for id in s.location_id.iter().rev() {
                let (start, len) = match frames.cache.get(id) {
                    Some(&r) => r,
                    None => {
                        let start = frames.flat.len();
                        for name in frames.of(*id) {
                            let name = self.intern(&name);
                            frames.flat.push(name);
                        }
                        let r = (start, frames.flat.len() - start);
                        frames.cache.insert(*id, r);
                        r
                    }
                };
                path.extend_from_slice(&frames.flat[start..start + len]);
            }
            if path.len() > MAX_DEPTH {
                path.truncate(MAX_DEPTH);
                self.truncated += 1;
            }
            self.samples += 1;
            let stamp = self.samples;
            let root = &mut self.nodes[0];
            root.value = root.value.saturating_add(v);
            let mut node = 0;
            for &name in path.iter() {
                node = self.child(node, name)?;
                let n = &mut self.nodes[node as usize];
                n.value = n.value.saturating_add(v);
                let t = &mut self.top[name as usize];
                // Once per stack: recursion does not count twice.
                if t.2 != stamp {
                    t.2 = stamp;
                    t.1 = t.1.saturating_add(v);
                }
            }
            if let Some(&leaf) = path.last() {
                let t = &mut self.top[leaf as usize];
                t.0 = t.0.saturating_add(v);
                let n = &mut self.nodes[node as usize];
                if !n.leaf {
                    n.leaf = true;
                    self.stacks += 1;
                }
            }
        }
        Ok(())
    }

    /// The finished graph, ready to serialize.
    pub(super) fn graph(&self) -> FlameGraph<'_> {
        let mut top: Vec<Top<'_>> = self
            .top
            .iter()
            .enumerate()
            .filter(|(_, t)| t.0 != 0 || t.1 != 0)
            .map(|(i, t)| Top {
                name: &self.names[i],
                flat: t.0,
                cum: t.1,
            })
            .collect();
        top.sort_by(|a, b| b.flat.cmp(&a.flat).then(b.cum.cmp(&a.cum)));
        top.truncate(MAX_TOP);
        let unit = self
            .sample_types
            .as_ref()
            .and_then(|t| t.first())
            .map(|(t, u)| format!("{t}/{u}"))
            .unwrap_or_default();
        FlameGraph {
            root: NodeView { flame: self, id: 0 },
            top,
            unit,
            total: self.nodes[0].value,
            stacks: self.stacks,
            truncated: self.truncated,
        }
    }
}

/// One window's lookups by id: the frame names of a location, and the interned names
/// of each location used so far (`cache`: location id → a range of `flat`).
struct Frames<'a> {
    p: &'a Profile,
    locations: HashMap<u64, usize>,
    functions: HashMap<u64, i64>,
    mappings: HashMap<u64, i64>,
    cache: HashMap<u64, (usize, usize)>,
    flat: Vec<u32>,
}

impl<'a> Frames<'a> {
    fn new(p: &'a Profile, work: &Work) -> Result<Self, Stopped> {
        let mut locations = HashMap::with_capacity(p.location.len());
        for (i, l) in p.location.iter().enumerate() {
            work.tick()?;
            locations.insert(l.id, i);
        }
        let mut functions = HashMap::with_capacity(p.function.len());
        for f in &p.function {
            work.tick()?;
            functions.insert(f.id, f.name);
        }
        let mappings = p.mapping.iter().map(|m| (m.id, m.filename)).collect();
        Ok(Self {
            p,
            locations,
            functions,
            mappings,
            cache: HashMap::new(),
            flat: Vec::new(),
        })
    }

    /// The frame names of location `id`, root first: inline frames expand (marked `_[i]`),
    /// unnamed code shows as its object and address.
    fn of(&self, id: u64) -> Vec<String> {
        let Some(loc) = self
            .locations
            .get(&id)
            .and_then(|&i| self.p.location.get(i))
        else {
            return Vec::new();
        };
        if loc.line.is_empty() {
            let object = self
                .mappings
                .get(&loc.mapping_id)
                .map_or("", |&f| str_at(self.p, f));
            return vec![format!("{object}+{:#x}", loc.address)];
        }
        loc.line
            .iter()
            .rev()
            .enumerate()
            .map(|(depth, line)| {
                let name = self
                    .functions
                    .get(&line.function_id)
                    .map_or("?", |&n| str_at(self.p, n));
                // Marked as in the folded stacks and the SVG.
                match depth {
                    0 => name.to_string(),
                    _ => format!("{name}{INLINED}"),
                }
            })
            .collect()
    }
}

/// A node as d3-flame-graph reads it: `{name, value, children}`, `value` including the
/// children.
pub(super) struct NodeView<'a> {
    flame: &'a Flame,
    id: u32,
}

impl Serialize for NodeView<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let node = &self.flame.nodes[self.id as usize];
        let has_children = node.first_child != NONE;
        let mut map = s.serialize_map(Some(if has_children { 3 } else { 2 }))?;
        map.serialize_entry("name", &self.flame.names[node.name as usize])?;
        map.serialize_entry("value", &node.value)?;
        if has_children {
            map.serialize_entry(
                "children",
                &Children {
                    flame: self.flame,
                    first: node.first_child,
                },
            )?;
        }
        map.end()
    }
}

/// The children of a node, in the order they were first seen.
struct Children<'a> {
    flame: &'a Flame,
    first: u32,
}

impl Serialize for Children<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(None)?;
        let mut c = self.first;
        while c != NONE {
            seq.serialize_element(&NodeView {
                flame: self.flame,
                id: c,
            })?;
            c = self.flame.nodes[c as usize].next_sibling;
        }
        seq.end()
    }
}

/// A row of the top-functions table.
#[derive(Serialize)]
pub(super) struct Top<'a> {
    name: &'a str,
    /// Samples with the function as the leaf.
    flat: i64,
    /// Samples with the function anywhere on the stack (once per stack).
    cum: i64,
}

/// What `/api/flamegraph` returns.
#[derive(Serialize)]
pub(super) struct FlameGraph<'a> {
    root: NodeView<'a>,
    top: Vec<Top<'a>>,
    /// What `value` counts (the first sample type), e.g. `samples/count`.
    unit: String,
    total: i64,
    /// Distinct stacks (paths of frame names) in the tree.
    stacks: usize,
    /// Samples whose stacks were deeper than the tree keeps.
    truncated: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Function, Line, Location, Mapping, Sample, ValueType};

    /// `main -> mid -> leaf` (and an unnamed frame in `libx.so`), inline `mid` inside
    /// `main`'s location.
    fn window(n: i64) -> Profile {
        let strings = ["", "samples", "count", "main", "mid", "leaf", "libx.so"];
        Profile {
            sample_type: vec![ValueType { r#type: 1, unit: 2 }],
            string_table: strings.map(String::from).to_vec(),
            mapping: vec![Mapping {
                id: 9,
                filename: 6,
                ..Default::default()
            }],
            function: (3..=5)
                .map(|i| Function {
                    id: i as u64 * 10,
                    name: i,
                    ..Default::default()
                })
                .collect(),
            location: vec![
                Location {
                    id: 1,
                    // Leaf first: `mid` inlined into `main`.
                    line: vec![
                        Line {
                            function_id: 40,
                            ..Default::default()
                        },
                        Line {
                            function_id: 30,
                            ..Default::default()
                        },
                    ],
                    ..Default::default()
                },
                Location {
                    id: 2,
                    line: vec![Line {
                        function_id: 50,
                        ..Default::default()
                    }],
                    ..Default::default()
                },
                Location {
                    id: 3,
                    mapping_id: 9,
                    address: 0x10,
                    ..Default::default()
                },
            ],
            sample: vec![
                Sample {
                    location_id: vec![2, 1],
                    value: vec![n],
                    label: vec![],
                },
                Sample {
                    location_id: vec![3, 2, 1],
                    value: vec![1],
                    label: vec![],
                },
            ],
            ..Default::default()
        }
    }

    #[test]
    fn sums_windows_names_inline_and_unnamed_frames() -> Result<(), Box<dyn std::error::Error>> {
        let mut f = Flame::new(100);
        let w = Work::unlimited();
        f.add(&window(3), &LabelFilter::default(), &w)?;
        f.add(&window(4), &LabelFilter::default(), &w)?;
        let json = serde_json::to_value(f.graph())?;
        assert_eq!(json["total"], 9);
        assert_eq!(json["unit"], "samples/count");
        assert_eq!(json["stacks"], 2);
        let main = &json["root"]["children"][0];
        assert_eq!(
            (main["name"].as_str(), main["value"].as_i64()),
            (Some("main"), Some(9))
        );
        let leaf = &main["children"][0]["children"][0];
        assert_eq!(leaf["name"], "leaf");
        assert_eq!(leaf["children"][0]["name"], "libx.so+0x10");
        assert_eq!(json["top"][0]["name"], "leaf");
        assert_eq!(
            (
                json["top"][0]["flat"].as_i64(),
                json["top"][0]["cum"].as_i64()
            ),
            (Some(7), Some(9))
        );
        Ok(())
    }

    #[test]
    fn stops_at_the_node_cap() {
        // all, main, mid, leaf: 4 nodes fit; the unnamed frame is the fifth.
        let mut f = Flame::new(4);
        let w = Work::unlimited();
        assert_eq!(
            f.add(&window(1), &LabelFilter::default(), &w),
            Err(FlameError::TooManyNodes { cap: 4 })
        );
    }
}
