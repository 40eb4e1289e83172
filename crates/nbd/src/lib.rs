//! tiercache-nbd (under construction).
