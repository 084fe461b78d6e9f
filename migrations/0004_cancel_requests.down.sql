-- 0004 down. Pending cancel requests are folded back into the job rows first, so none is lost.
UPDATE etl_job_records j
   SET cancel_requested_at = c.requested_at
  FROM etl_job_cancel_requests c
 WHERE c.job_id = j.id AND j.cancel_requested_at IS NULL AND j.status = 'running';
DROP TABLE etl_job_cancel_requests;
