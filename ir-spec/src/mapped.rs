//! The memory maps that imported weights are read from (the model file, external data
//! files), kept so their pages can be handed back once compilation has consumed them.
//!
//! Weights are read straight out of the map (no copy); packing or folding reads each of
//! them once, and every page read stays resident — and counted in the process's RSS —
//! while the map lives, though the program holds the weights in their packed form. For a
//! ResNet-50 that is 100 MB on top of the packed weights at the peak of loading. The maps
//! are read-only and private, so dropping their pages (`MADV_DONTNEED`) loses nothing: a
//! later read faults the page back in from the page cache.

use memmap2::Mmap;
use std::sync::{Arc, Mutex, Weak};

/// Every map made by an import in this process that may still be in use.
static MAPS: Mutex<Vec<Weak<Mmap>>> = Mutex::new(Vec::new());

/// Records `map` for [`release_pages`] and returns it shared.
pub fn register(map: Mmap) -> Arc<Mmap> {
    let map = Arc::new(map);
    let mut maps = MAPS.lock().unwrap_or_else(|e| e.into_inner());
    maps.retain(|w| w.strong_count() > 0);
    maps.push(Arc::downgrade(&map));
    map
}

/// Hands the resident pages of every live weight map back to the kernel: call it when
/// compilation has packed the weights (the runtime reads none of them afterwards, and if
/// anything does, the page is read in again). Errors from the kernel are ignored: the
/// pages then simply stay.
pub fn release_pages() {
    let maps: Vec<Arc<Mmap>> = {
        let mut maps = MAPS.lock().unwrap_or_else(|e| e.into_inner());
        maps.retain(|w| w.strong_count() > 0);
        maps.iter().filter_map(Weak::upgrade).collect()
    };
    #[cfg(unix)]
    for m in maps {
        // SAFETY: the maps are private and read-only (never written), so discarding their
        // pages cannot lose data: the next access reads the file again.
        let _ = unsafe { m.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) };
    }
    #[cfg(not(unix))]
    drop(maps);
}

/// Whether `bytes` lie in a live weight map: pages [`release_range`] can hand back, which
/// a later read faults in again from the file.
pub fn in_map(bytes: &[u8]) -> bool {
    let (start, end) = (bytes.as_ptr() as usize, bytes.as_ptr() as usize + bytes.len());
    let maps = MAPS.lock().unwrap_or_else(|e| e.into_inner());
    maps.iter().filter_map(Weak::upgrade).any(|m| {
        let base = m.as_ptr() as usize;
        start >= base && end <= base + m.len()
    })
}

/// Hands back the resident pages under `bytes` if they lie in a live weight map (a
/// weight just packed: the program holds its packed form). Bytes elsewhere — owned memory,
/// which `MADV_DONTNEED` would zero — are left alone.
pub fn release_range(bytes: &[u8]) {
    let (start, end) = (bytes.as_ptr() as usize, bytes.as_ptr() as usize + bytes.len());
    let map = {
        let maps = MAPS.lock().unwrap_or_else(|e| e.into_inner());
        maps.iter().filter_map(Weak::upgrade).find(|m| {
            let base = m.as_ptr() as usize;
            start >= base && end <= base + m.len()
        })
    };
    #[cfg(unix)]
    if let Some(m) = map {
        let offset = start - m.as_ptr() as usize;
        // SAFETY: as in `release_pages`; the range lies inside the map (memmap2 widens it
        // to whole pages, which only drops more pages of the same read-only map).
        let _ = unsafe { m.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset, bytes.len()) };
    }
    #[cfg(not(unix))]
    drop(map);
}

/// Hands the pages of memory freed since the last call back to the kernel (glibc's
/// `malloc_trim`; elsewhere nothing). Compilation frees large buffers — codes of weights
/// just laid out, unpacked copies — that the allocator keeps in its heap as holes, all of
/// them counted in the process's resident memory though nothing uses them: with 8-bit
/// weights, a BERT-base held 55 MB of such holes at its peak, 40% of the whole.
pub fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory of the allocator's own arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A shared map as the owner of [`bytes::Bytes`].
pub struct Shared(pub Arc<Mmap>);

impl AsRef<[u8]> for Shared {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_pages_read_back_and_owned_memory_is_left_alone() {
        let path = std::env::temp_dir().join(format!("aim-mapped-test-{}", std::process::id()));
        let data: Vec<u8> = (0..3 * 4096 + 17).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: a private read-only map of a file this test owns.
        let map = register(unsafe { Mmap::map(&file) }.unwrap());
        assert_eq!(&map[..], &data[..]);
        release_range(&map[100..5000]);
        release_pages();
        assert_eq!(&map[..], &data[..], "the pages come back from the file");
        // Owned bytes are not in any map: untouched (MADV_DONTNEED would zero them).
        let owned = vec![7u8; 3 * 4096];
        release_range(&owned);
        assert!(owned.iter().all(|&b| b == 7));
        drop(map);
        std::fs::remove_file(&path).unwrap();
    }
}
