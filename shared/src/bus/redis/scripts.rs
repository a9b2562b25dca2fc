//! The Lua scripts of the Redis bus. Each runs atomically in Redis, which is what makes
//! fencing, retention and the follower's bounded read safe against concurrent writers.
//! `redis::Script` sends EVALSHA and reloads on NOSCRIPT, so a restarted Redis is fine.
//!
//! Epochs are large (the Kubernetes mode's floors are around 4·10^15) and Lua numbers are
//! doubles: exact below 2^53, which every epoch stays under, but `tostring` and numbers
//! passed to `redis.call` print only 14 digits. So an epoch is only ever compared as a
//! number and written back as the caller's own string (`ARGV`), or returned as a number
//! (an integer reply, exact).

/// Takes the caller's floor as the epoch, unless the counter or the epoch stored with
/// `latest` is higher: then nothing changes and the higher one is returned, so the caller
/// stands down. Equal to the counter is granted again (a retry whose reply was lost). The
/// counter only ever takes a floor the caller derived from outside Redis, so a Redis that
/// restarted empty cannot be re-seeded by a deposed writer's memory.
///
/// KEYS: epoch counter, latest. ARGV: floor.
/// Returns `{'taken', floor}` or `{'superseded', higher}`.
pub(super) const TAKE_EPOCH: &str = r#"
local counter = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
local stored = tonumber(redis.call('HGET', KEYS[2], 'epoch') or '0') or 0
local floor = tonumber(ARGV[1])
if counter > floor or stored > floor then
  if stored > counter then counter = stored end
  return {'superseded', counter}
end
redis.call('SET', KEYS[1], ARGV[1])
return {'taken', floor}
"#;

/// Puts the caller's epoch back into a counter Redis lost (restarted empty), so that a
/// writer with a lower epoch is fenced again at once. Only the watchdog of a publisher
/// that still holds the claim runs it. Never lowers the counter.
///
/// KEYS: epoch counter. ARGV: epoch. Returns the counter afterwards.
pub(super) const RESTORE_EPOCH: &str = r#"
local counter = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if counter < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
  return tonumber(ARGV[1])
end
return counter
"#;

/// Allocates the next version: `max(counter, floor) + 1`. The floor is the highest
/// version the caller knows of (`latest` and what it last published), so after Redis lost
/// its data the counter is re-seeded above everything already handed out.
///
/// KEYS: version counter. ARGV: version floor. Returns the allocated version.
pub(super) const ALLOCATE: &str = r#"
local counter = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
local floor = tonumber(ARGV[1])
if counter < floor then counter = floor end
counter = counter + 1
redis.call('SET', KEYS[1], counter)
return counter
"#;

/// Advances `latest` to a blob already written (with a TTL, so an abandoned one expires),
/// if and only if the version is newer than `latest`'s and the epoch is not older than
/// both `latest`'s and the epoch counter (a new leader fences the old one as soon as it
/// takes its epoch). A `latest` that cannot be read (a field missing or not a number)
/// fences nobody: it is replaced whole. On success: the blob is made persistent, indexed
/// with its reference (for followers that must fall back to a retained blob), blobs
/// beyond the newest K become superseded (a TTL, not deleted: a follower may be fetching
/// one), superseded blobs beyond the newest M are deleted at once (so a burst of
/// publishes cannot fill Redis: at most K + M blobs exist, plus one being written), and
/// the new version is announced. On refusal the blob is deleted. Same rule as
/// `bus::check_advance`.
///
/// KEYS: latest, epoch counter, blob, index, superseded index, references.
/// ARGV: version, hash, epoch, published_at_ms, keep K, superseded TTL (ms), blob key
/// prefix, notification channel, superseded kept M.
/// Returns `{'ok'}`, `{'fenced', version, hash, epoch, published_at_ms}` (fields empty when
/// `latest` is missing) or `{'missing'}` (the blob expired before the advance).
pub(super) const ADVANCE: &str = r#"
local latest = redis.call('HMGET', KEYS[1], 'version', 'hash', 'epoch', 'published_at_ms')
local version = tonumber(ARGV[1])
local epoch = tonumber(ARGV[3])
local taken = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
local fenced = epoch < taken
local current_version = tonumber(latest[1] or '')
local current_epoch = tonumber(latest[3] or '')
if current_version and current_epoch and latest[2] then
  if version <= current_version or epoch < current_epoch then fenced = true end
end
if fenced then
  redis.call('DEL', KEYS[3])
  return {'fenced', latest[1] or '', latest[2] or '', latest[3] or '', latest[4] or ''}
end
if redis.call('EXISTS', KEYS[3]) == 0 then
  return {'missing'}
end
redis.call('PERSIST', KEYS[3])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'version', ARGV[1], 'hash', ARGV[2], 'epoch', ARGV[3], 'published_at_ms', ARGV[4])
redis.call('ZADD', KEYS[4], version, ARGV[1])
redis.call('HSET', KEYS[6], ARGV[1], ARGV[3] .. ' ' .. ARGV[2] .. ' ' .. ARGV[4])
local keep = tonumber(ARGV[5])
local count = redis.call('ZCARD', KEYS[4])
if count > keep then
  local old = redis.call('ZRANGE', KEYS[4], 0, count - keep - 1)
  for _, v in ipairs(old) do
    redis.call('PEXPIRE', ARGV[7] .. v, ARGV[6])
    redis.call('ZADD', KEYS[5], tonumber(v), v)
    redis.call('HDEL', KEYS[6], v)
  end
  redis.call('ZREMRANGEBYRANK', KEYS[4], 0, count - keep - 1)
end
local superseded_keep = tonumber(ARGV[9])
local superseded = redis.call('ZCARD', KEYS[5])
if superseded > superseded_keep then
  local gone = redis.call('ZRANGE', KEYS[5], 0, superseded - superseded_keep - 1)
  for _, v in ipairs(gone) do
    redis.call('DEL', ARGV[7] .. v)
  end
  redis.call('ZREMRANGEBYRANK', KEYS[5], 0, superseded - superseded_keep - 1)
end
redis.call('PUBLISH', ARGV[8], ARGV[1])
return {'ok'}
"#;

/// Reads a blob only if it fits the reader's limit, in one atomic step (the size cannot
/// change between the check and the read).
///
/// KEYS: blob. ARGV: largest size accepted.
/// Returns `{0}` (missing or empty), `{size}` (too large: not sent) or `{size, blob}`.
pub(super) const FETCH_BOUNDED: &str = r#"
local size = redis.call('STRLEN', KEYS[1])
if size == 0 or size > tonumber(ARGV[1]) then
  return {size}
end
return {size, redis.call('GET', KEYS[1])}
"#;
