//! [`advance`]: a cursor over a reply's parts (slices sent in order by
//! `writev` or `vmsplice`), moved over what one call sent.

/// Moves the cursor (`idx`: the part, `off`: the byte within it) over `n`
/// bytes of `parts`; `n` is at most what is left from the cursor.
pub(crate) fn advance(parts: &[&[u8]], idx: &mut usize, off: &mut usize, mut n: usize) {
    while n > 0 {
        let rem = parts[*idx].len() - *off;
        if n >= rem {
            n -= rem;
            *idx += 1;
            *off = 0;
        } else {
            *off += n;
            n = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cursor_crosses_parts_and_stops_inside_one() {
        let parts: [&[u8]; 3] = [b"abc", b"", b"defg"];
        let (mut idx, mut off) = (0, 0);
        advance(&parts, &mut idx, &mut off, 2);
        assert_eq!((idx, off), (0, 2));
        advance(&parts, &mut idx, &mut off, 3);
        assert_eq!((idx, off), (2, 2));
        advance(&parts, &mut idx, &mut off, 2);
        assert_eq!((idx, off), (3, 0));
    }
}
