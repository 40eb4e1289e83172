//! FileDevice on a real block device node. Ignored by default because it
//! needs one to destroy; run as
//! `TIERCACHE_TEST_BLKDEV=/dev/loop0 cargo test -p tiercache-device --test block_device -- --ignored`
//! (e.g. after `losetup -f --show some-64M-file`).

use tiercache_device::{AlignedBuf, BlockDevice, FileDevice};

#[test]
#[ignore = "needs TIERCACHE_TEST_BLKDEV=/dev/... whose contents it overwrites"]
fn block_device_read_write_discard() {
    let path = std::env::var("TIERCACHE_TEST_BLKDEV")
        .expect("set TIERCACHE_TEST_BLKDEV to a block device it may overwrite");
    let d = FileDevice::open(&path).unwrap();
    assert!(d.is_block_device());
    assert!(d.size() >= 1 << 20 && d.size() % d.alignment() == 0);
    assert_eq!(
        d.size(),
        std::fs::read_to_string(format!(
            "/sys/class/block/{}/size",
            std::path::Path::new(&path)
                .file_name()
                .unwrap()
                .to_str()
                .unwrap()
        ))
        .map(|s| s.trim().parse::<u64>().unwrap() * 512)
        .unwrap_or(d.size())
    );
    let mut w = AlignedBuf::new(64 << 10);
    for (i, b) in w.iter_mut().enumerate() {
        *b = (i % 251) as u8 + 1;
    }
    let off = d.size() - (64 << 10);
    d.write_at(&w, off).unwrap();
    d.flush().unwrap();
    let mut r = AlignedBuf::new(64 << 10);
    d.read_at(&mut r, off).unwrap();
    assert_eq!(&r[..], &w[..]);
    // Unaligned memory bounces.
    let mut v = vec![0u8; 4097];
    d.read_at(&mut v[1..], off).unwrap();
    assert_eq!(&v[1..], &w[..4096]);
    // Discard succeeds (by BLKDISCARD or by writing zeros); the data is
    // then unspecified, so only the call is checked.
    d.discard(off, 64 << 10).unwrap();
    assert!(d.read_at(&mut r, d.size()).is_err());
}
