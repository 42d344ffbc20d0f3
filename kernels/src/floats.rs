//! The floats a prepared kernel reads: a buffer it packed itself, or a view of a tensor
//! that already holds them packed (a prepacked weight memory-mapped from a `.aim` file),
//! so that loading such a file packs nothing and copies nothing.

use aim_ir::{DType, Tensor};

/// Read-only f32 storage: owned, or a range of an f32 tensor kept alive by this value.
pub struct Floats {
    ptr: *const f32,
    len: usize,
    _owner: Owner,
}

enum Owner {
    Vec(Vec<f32>),
    Tensor(Tensor),
}

// SAFETY: the floats are never written after construction, and the owner (a Vec or a
// tensor, both Send + Sync) keeps them alive for as long as this value lives.
unsafe impl Send for Floats {}
unsafe impl Sync for Floats {}

impl Floats {
    /// Floats owned by this value.
    pub fn owned(v: Vec<f32>) -> Floats {
        Floats { ptr: v.as_ptr(), len: v.len(), _owner: Owner::Vec(v) }
    }

    /// Floats `start..start + len` of the f32 tensor `t`, without copying them (an
    /// unaligned tensor is viewed through its aligned copy). `None` when `t` is not f32 or
    /// is too short.
    pub fn view(t: &Tensor, start: usize, len: usize) -> Option<Floats> {
        if t.dtype() != DType::F32 || start.checked_add(len)? > t.len() {
            return None;
        }
        let data = t.data::<f32>();
        Some(Floats { ptr: data[start..].as_ptr(), len, _owner: Owner::Tensor(t.clone()) })
    }
}

impl Floats {
    /// The floats' bytes.
    fn bytes(&self) -> &[u8] {
        // SAFETY: the floats, viewed as their bytes.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len * 4) }
    }

    /// Bytes of these floats that lie in a memory-mapped file (a `.aim` file's prepacked
    /// weights): what [`Floats::release_pages`] can hand back. 0 for owned floats.
    pub fn mapped_bytes(&self) -> usize {
        match &self._owner {
            Owner::Tensor(_) if aim_ir::mapped::in_map(self.bytes()) => self.len * 4,
            _ => 0,
        }
    }

    /// Hands the resident pages of floats viewed in a mapped file back to the kernel; the
    /// next read faults them in again from the file (the page cache). Owned floats stay.
    pub fn release_pages(&self) {
        if let Owner::Tensor(_) = &self._owner {
            aim_ir::mapped::release_range(self.bytes());
        }
    }
}

impl std::ops::Deref for Floats {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        // SAFETY: `ptr` and `len` describe floats the owner keeps alive and unchanged.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Clone for Floats {
    fn clone(&self) -> Floats {
        match &self._owner {
            Owner::Vec(v) => Floats::owned(v.clone()),
            // The same floats of the same (shared) tensor.
            Owner::Tensor(t) => Floats { ptr: self.ptr, len: self.len, _owner: Owner::Tensor(t.clone()) },
        }
    }
}

impl std::fmt::Debug for Floats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if matches!(self._owner, Owner::Vec(_)) { "owned" } else { "view" };
        write!(f, "Floats({} {kind})", self.len)
    }
}
