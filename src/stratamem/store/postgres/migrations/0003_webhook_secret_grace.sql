-- A rotated secret can stay valid for a grace period: deliveries are signed with both
-- secrets until previous_secret_until (ISO UTC), so receivers switch without dropping any.
ALTER TABLE webhooks
    ADD COLUMN previous_secret text,
    ADD COLUMN previous_secret_until text COLLATE "C";
