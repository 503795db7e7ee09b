//! The reference data adapter reads the authors' data as it is, and the memory
//! estimate is compared with their measured micro-batch limits.

use rubick_io::reference::ReferenceData;
use rubick_model::MemoryEstimator;
use rubick_model::reference::{Agreement, agreement_table, memory_agreement};

/// The reference data set, opened.
fn data() -> Option<ReferenceData> {
    rubick_tests::reference().map(|dir| ReferenceData::open(&dir).expect("reference data opens"))
}

#[test]
fn reads_every_model_table_trace_and_profile() {
    let Some(data) = data() else { return };
    assert_eq!(data.model_names(), ["bert", "gpt2", "llama30", "llama7", "roberta", "t5", "vit"]);
    let mut total = 0;
    for model in data.model_names() {
        let rows = data.measured_rows(model).unwrap();
        assert!(!rows.is_empty(), "{model}");
        for row in &rows {
            if let Some(gpus) = row.code.gpus() {
                assert_eq!(gpus, row.placement.gpus());
            }
            if let Some(p) = row.phases {
                // After unit normalisation the phases are of the order of the iteration.
                assert!(p.forward_s + p.backward_sync_s + p.optimizer_s < 3.0 * row.iter_time_s, "{model} {row:?}");
            }
        }
        total += rows.len();
        let runs = data.profiles(model).unwrap();
        assert!((3..=7).contains(&runs.len()), "{model}: {} profile runs", runs.len());
    }
    assert_eq!(total, 512, "measured rows over the seven models");
    let base = data.trace("workload-base").unwrap();
    assert_eq!(base.len(), 406);
    assert!(base.iter().all(|j| data.facts(&j.application).is_some()), "every trace job names a known model");
    assert_eq!(data.trace("naive").unwrap().len(), 10);
}

#[test]
fn memory_estimate_agrees_with_the_measured_limits() {
    let Some(data) = data() else { return };
    let estimator = MemoryEstimator::default();
    let mut rows = Vec::new();
    for model in data.model_names() {
        rows.extend(memory_agreement(model, data.facts(model).unwrap(), &estimator, 80.0, 8));
    }
    println!("{}", agreement_table(&rows));
    let find = |m: &str, f: &str| rows.iter().find(|r| r.model == m && r.family.as_str() == f).unwrap();
    // The facts the foundation issue names: LLaMA-2-7B plain DP does not fit, ZeRO-DP
    // fits micro-batch 2 but not 4.
    assert_eq!(find("llama7", "dp").estimate, 0);
    assert_eq!(find("llama7", "dp_gc").estimate, 0);
    assert_eq!(find("llama7", "zero_dp").estimate, 2);
    let agree = rows.iter().filter(|r| r.agreement == Agreement::Agree).count();
    let above = rows.iter().filter(|r| r.agreement == Agreement::FactAboveEstimate).count();
    println!("{agree} of {} facts agree; {above} where the estimate is too conservative", rows.len());
    // Every data-parallel fact of the six models with exact shapes agrees except the
    // LLaMA-7B ZeRO-Offload one (see the closing note of the foundation issue).
    assert!(agree >= 24, "only {agree} facts agree:\n{}", agreement_table(&rows));
    assert!(above <= 1, "{}", agreement_table(&rows));
}
