"""The write side: the spool (journal of files written), the pack queue, the write rules."""
