//! The shared-prefix generator: groups share their system prompt, conversations grow turn by
//! turn, Zipf popularity skews groups, and the same seed gives the same workload.

use std::collections::HashMap;

use bench_harness::replay::synthetic::{Popularity, SyntheticSpec, SyntheticWorkload};
use bench_harness::replay::workload::{WorkItem, Workload};

fn spec() -> SyntheticSpec {
    SyntheticSpec {
        groups: 4,
        prompts_per_group: 8,
        system_prompt_tokens: 100,
        question_tokens: 10,
        output_tokens: 5,
        popularity: Popularity::Uniform,
        turns: 1,
        seed: 7,
        requests: None,
    }
}

fn items(spec: SyntheticSpec) -> Vec<WorkItem> {
    let mut workload = SyntheticWorkload::new(spec).unwrap();
    std::iter::from_fn(|| workload.next_item()).collect()
}

fn prompt_len(item: &WorkItem) -> u64 {
    item.generated().expect("a generated prompt").len_tokens()
}

fn tokens(item: &WorkItem) -> Vec<u32> {
    item.generated()
        .expect("a generated prompt")
        .symbols()
        .collect()
}

#[test]
fn groups_share_their_system_prompt_and_nothing_else() {
    let all = items(spec());
    assert_eq!(
        all.len(),
        32,
        "groups × prompts per group × turns by default"
    );
    let mut by_group: HashMap<u64, Vec<Vec<u32>>> = HashMap::new();
    for item in &all {
        assert_eq!(prompt_len(item), 110);
        by_group
            .entry(item.tenant_key)
            .or_default()
            .push(tokens(item));
    }
    let systems: Vec<Vec<u32>> = by_group
        .values()
        .map(|prompts| prompts[0][..100].to_vec())
        .collect();
    for prompts in by_group.values() {
        assert!(prompts.iter().all(|p| p[..100] == prompts[0][..100]));
    }
    for (i, a) in systems.iter().enumerate() {
        for b in &systems[i + 1..] {
            assert_ne!(
                a[..16],
                b[..16],
                "different groups must not share a first page"
            );
        }
    }
}

#[test]
fn conversations_grow_turn_by_turn() {
    let spec = SyntheticSpec {
        groups: 1,
        prompts_per_group: 1,
        turns: 3,
        requests: Some(4),
        ..spec()
    };
    let all = items(spec);
    let lengths: Vec<u64> = all.iter().map(prompt_len).collect();
    // Turn 1: system + question; turn 2 adds answer + question; turn 3 again; then a fresh one.
    assert_eq!(lengths, vec![110, 125, 140, 110]);
    let (t1, t2, t3, fresh) = (
        tokens(&all[0]),
        tokens(&all[1]),
        tokens(&all[2]),
        tokens(&all[3]),
    );
    assert_eq!(t2[..110], t1[..], "turn 2 starts with turn 1");
    assert_eq!(t3[..125], t2[..], "turn 3 starts with turn 2");
    assert_eq!(
        fresh[..100],
        t1[..100],
        "a restarted conversation keeps the system prompt"
    );
    assert_ne!(fresh[100..], t1[100..], "but asks a new question");
}

#[test]
fn zipf_popularity_favours_the_first_groups_and_seeds_repeat() {
    let zipf = SyntheticSpec {
        groups: 16,
        popularity: Popularity::Zipf { exponent: 1.2 },
        requests: Some(4000),
        ..spec()
    };
    let all = items(zipf.clone());
    let mut counts = [0u32; 16];
    for item in &all {
        counts[item.tenant_key as usize] += 1;
    }
    assert!(counts[0] > 3 * counts[7], "{counts:?}");
    assert!(
        counts[0] > counts[1] && counts[1] > counts[15],
        "{counts:?}"
    );
    assert_eq!(items(zipf), all, "the same seed makes the same workload");
}

#[test]
fn out_of_range_settings_name_their_flag() {
    let err = SyntheticWorkload::new(SyntheticSpec { turns: 0, ..spec() })
        .err()
        .unwrap();
    assert!(err.contains("--turns"), "{err}");
    let err = SyntheticWorkload::new(SyntheticSpec {
        groups: 0,
        ..spec()
    })
    .err()
    .unwrap();
    assert!(err.contains("--groups"), "{err}");
}
