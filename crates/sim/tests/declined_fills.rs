//! The default's declined fills reach the simulator's table and JSON: a
//! stream of 16-block writes never read back, through a writethrough
//! cache, is mostly not filled once the cache is full, and the `declined`
//! column, between `promoted` and `demoted`, says how many.

use tiercache_policy::PolicyConfig;
use tiercache_sim::simulate::IterSource;
use tiercache_sim::*;
use tiercache_types::{Access, Time};

#[test]
fn the_table_and_json_count_the_defaults_declined_fills() {
    let cache_blocks = 1024u64;
    let writes = 4 * cache_blocks; // 64 times the cache in blocks
    let requests = (0..writes).map(|i| Request {
        time: Time(i),
        offset: i * 16 * 4096,
        len: 16 * 4096,
        access: Access::Write,
    });
    let spec = SimSpec {
        cache_sizes: vec![cache_blocks * 4096],
        policies: vec![PolicyConfig::default()],
        sequential_cutoff: 0,
        threads: 1,
        ..SimSpec::default()
    };
    let r = simulate(&mut IterSource(requests), "writes", &spec, &|_| {}).unwrap();
    let k = &r.configs[0].counters;
    let written = writes * 16;
    assert_eq!(k.write_misses, written);
    assert_eq!(k.promotions + k.declined_fills, written);
    assert!(
        k.declined_fills > written * 3 / 4,
        "declined {} of {written}",
        k.declined_fills
    );
    let table = render_table(&r);
    let header = table
        .lines()
        .find(|l| l.starts_with("cache") && l.contains("policy"))
        .expect("a header");
    assert!(header.contains("promoted  declined  demoted"), "{header}");
    let row = table
        .lines()
        .find(|l| l.contains("adaptive+always"))
        .expect("the default's row");
    let cells = row.split_whitespace().collect::<Vec<_>>().join(" ");
    let expected = format!("{} {} {}", k.promotions, k.declined_fills, k.demotions);
    assert!(cells.contains(&expected), "{expected} in\n{table}");
    assert!(to_json(&r).contains(&format!("\"declined_fills\": {}", k.declined_fills)));
}
